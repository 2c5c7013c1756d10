"""Shared-prefix forwards for Gated DeltaNet layers (Qwen3.5): run the prompt once, fork its state to each answer.

A packed row (:mod:`video_grpo.inputs.prefix`) is ``[stem | segment 1 | segment 2 | ... | padding]``. Attention layers
keep the segments apart with the 4-D mask. A Gated DeltaNet layer has no mask: it carries a recurrent state
``S`` (``[heads, k_dim, v_dim]``) and a causal convolution over its last ``kernel - 1`` inputs along the row, so
segment 2 would read segment 1 through them. But a layer's output on an answer token depends on the prompt only
through the state at the end of the stem: ``S`` and the stem's last ``kernel - 1`` convolution inputs. So, per
linear-attention layer:

1. each packed row's stem runs from a zero state (as a plain row's prompt does) and keeps both final states;
2. the segments run as a batch of right-padded rows, each starting from a copy of its stem's states
   (``index_select``, so autograd sums the G copies' gradients back into the stem);
3. the outputs go back to their packed positions; padding gets zeros.

Right padding after a segment changes nothing before it (both the convolution and the chunked delta rule are
causal), and a segment's final state is not needed.

**The contract with the kernels** is the one transformers' own cached forward uses, so the same code runs with
transformers' pure-torch kernels (CPU, tests) and with the kernels GPU users get, which the module-level names of
``modeling_qwen3_5`` resolve to when installed (``use_kernel_func_from_hub_with_fallback``):

- recurrent state: ``torch_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True,
  use_qk_l2norm_in_kernel=True)`` with one initial state per batch row ``[rows, heads, k_dim, v_dim]``, the final
  state out. flash-linear-attention's ``chunk_gated_delta_rule`` has this signature, and its backward returns
  the initial state's gradient (``dh0``). Its ``cu_seqlens`` (one state per packed sequence) would let the stems
  and the segments each run as one variable-length row instead of padded rows; we do not use it, so the
  pure-torch fallback (which ignores ``cu_seqlens``) and fla compute the same thing.
- convolution state: the ``kernel - 1`` inputs before a sequence are prepended and the first ``kernel - 1``
  outputs dropped (what ``Cache.update_conv_state`` does before ``causal_conv1d_fn``, which resolves to Dao's
  ``causal-conv1d`` package when installed). fla's ``causal_conv1d(x, weight, bias, initial_state=...,
  output_final_state=True, activation=..., cu_seqlens=...)`` (``fla.modules.convolution``, ``x`` as
  ``[batch, time, channels]``) and Dao's ``causal_conv1d_fn(..., initial_states=...)`` take the same inputs as an
  initial state; prepending them is equivalent and needs no kernel-specific argument.

:func:`install` wraps ``Qwen3_5GatedDeltaNet.forward`` once per process. The wrapper runs the original forward
unless the call carries ``state_fork=<StateFork>`` (which :func:`video_grpo.inputs.prefix.pack_rows` puts in a packed
forward's model inputs). It travels as a keyword argument, so gradient checkpointing replays it with the layer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class StateFork:
    """Where each packed row's stem and segments are (built by :func:`layout` from the segment ids)."""

    stem_lengths: list[int]  # per packed row
    segment_rows: torch.Tensor  # (segments,) packed row of each segment
    segment_index: torch.Tensor  # (segments, longest) flat position (row * width + column); 0 where padding
    segment_valid: torch.Tensor  # (segments, longest) bool

    def to(self, device) -> StateFork:
        return StateFork(
            self.stem_lengths,
            self.segment_rows.to(device),
            self.segment_index.to(device),
            self.segment_valid.to(device),
        )


def layout(segments: torch.Tensor) -> StateFork:
    """From per-position segment ids ``(rows, width)`` (-1 stem, >= 0 answer, -2 padding; the stem first, then
    the answers in order, as :func:`video_grpo.inputs.prefix.pack_rows` lays them out)."""
    rows, width = segments.shape
    stems, spans = [], []
    for row in range(rows):
        ids = segments[row].tolist()
        stem = ids.count(-1)
        if ids[:stem] != [-1] * stem:
            raise ValueError("state_fork: the stem must come first in a packed row")
        stems.append(stem)
        start = stem
        while start < width and ids[start] >= 0:
            end = start
            while end < width and ids[end] == ids[start]:
                end += 1
            spans.append((row, start, end))
            start = end
    longest = max((end - start for _, start, end in spans), default=0)
    index = torch.zeros(len(spans), longest, dtype=torch.long)
    valid = torch.zeros(len(spans), longest, dtype=torch.bool)
    for number, (row, start, end) in enumerate(spans):
        index[number, : end - start] = row * width + torch.arange(start, end)
        valid[number, : end - start] = True
    return StateFork(stems, torch.tensor([row for row, _, _ in spans], dtype=torch.long), index, valid)


def _mix(layer, mixed_qkv, g, beta, conv_context, initial_state, output_final_state):
    """Convolution then gated delta rule on ``(rows, length, channels)`` inputs that continue from
    ``conv_context`` ``(rows, channels, kernel - 1)`` and ``initial_state`` (None: zeros)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    rows, length, _ = mixed_qkv.shape
    context = conv_context.shape[-1]
    x = torch.cat([conv_context.to(mixed_qkv.dtype), mixed_qkv.transpose(1, 2)], dim=-1)
    x = qwen.causal_conv1d_fn(
        x, layer.conv1d.weight.squeeze(1), layer.conv1d.bias, activation=layer.activation
    )
    x = x[:, :, context:].transpose(1, 2)
    query, key, value = torch.split(x, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    query = query.reshape(rows, length, -1, layer.head_k_dim)
    key = key.reshape(rows, length, -1, layer.head_k_dim)
    value = value.reshape(rows, length, -1, layer.head_v_dim)
    return qwen.torch_chunk_gated_delta_rule(
        query,
        key,
        value,
        g=g,
        beta=beta,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=True,
    )


def forked_forward(layer, hidden_states: torch.Tensor, fork: StateFork) -> torch.Tensor:
    """``Qwen3_5GatedDeltaNet.forward`` on packed rows: each segment continues from its stem's state. (The
    wrapper in :func:`install` fires accelerate's hooks on ``conv1d`` first, as the original forward does.)"""
    rows, width, _ = hidden_states.shape
    context = layer.conv_kernel_size - 1
    mixed_qkv = layer.in_proj_qkv(hidden_states)
    z = layer.in_proj_z(hidden_states).reshape(rows, width, -1, layer.head_v_dim)
    beta = layer.in_proj_b(hidden_states).sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(layer.in_proj_a(hidden_states).float() + layer.dt_bias)

    outputs, positions, states, conv_states = [], [], [], []
    for row, stem in enumerate(fork.stem_lengths):
        qkv = mixed_qkv[row : row + 1, :stem]
        zeros = qkv.new_zeros(1, qkv.shape[-1], context)  # a plain row's prompt starts from nothing
        out, state = _mix(layer, qkv, g[row : row + 1, :stem], beta[row : row + 1, :stem], zeros, None, True)
        outputs.append(out[0])
        positions.append(torch.arange(row * width, row * width + stem, device=hidden_states.device))
        states.append(state)
        conv_states.append(F.pad(qkv.transpose(1, 2), (context, 0))[:, :, -context:] if context else zeros)
    if fork.segment_rows.numel():
        index, valid = fork.segment_index, fork.segment_valid
        keep = valid[..., None].to(mixed_qkv.dtype)
        out, _ = _mix(
            layer,
            mixed_qkv.flatten(0, 1)[index] * keep,
            g.flatten(0, 1)[index] * valid[..., None],
            beta.flatten(0, 1)[index] * keep,
            torch.cat(conv_states).index_select(0, fork.segment_rows),
            torch.cat(states).index_select(0, fork.segment_rows),
            False,
        )
        outputs.append(out[valid])
        positions.append(index[valid])
    core = torch.cat(outputs)
    core_attn_out = core.new_zeros(rows * width, *core.shape[1:]).index_put((torch.cat(positions),), core)
    core_attn_out = layer.norm(core_attn_out.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
    return layer.out_proj(core_attn_out.reshape(rows, width, -1))


@functools.cache
def install() -> None:
    """Wrap ``Qwen3_5GatedDeltaNet.forward`` (once): a call with ``state_fork=`` runs :func:`forked_forward`,
    any other the original forward unchanged."""
    from transformers.integrations.accelerate import force_accelerate_hooks
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    original = Qwen3_5GatedDeltaNet.forward
    forked = force_accelerate_hooks("conv1d")(forked_forward)  # its weight is read directly, not called

    @functools.wraps(original)
    def forward(self, hidden_states, *args, state_fork: StateFork | None = None, **kwargs):
        if state_fork is None:
            return original(self, hidden_states, *args, **kwargs)
        if args or kwargs.get("cache") is not None:
            raise ValueError("state_fork: a packed forward runs without a cache")
        return forked(self, hidden_states, state_fork)

    Qwen3_5GatedDeltaNet.forward = forward
