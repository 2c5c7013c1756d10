"""Shared-prefix forwards: each prompt goes through the language model once, and its answers attend to that copy.

In GRPO the G answers of a group share one long video prompt (thousands of visual tokens) and are short. The
plain training forward carries G rows of ``prompt + answer``; this module packs the rows of a micro-batch that
share a prompt into one row instead::

    [ prompt minus its last token | last token, answer 1 | last token, answer 2 | ... | padding ]

with a 4-D attention mask: the stem attends causally to itself, and each segment attends to the whole stem and
causally to itself, never to another segment. A segment starts with a copy of the prompt's last token, at that
token's position, so its hidden state is the one that predicts the answer's first token in the plain row; the
other prompt tokens are processed once. Positions come from the model's own ``get_rope_index`` on the unpadded
prompt (for Qwen2.5-VL that is :mod:`video_grpo.inputs.positions`' reference layout), and each answer continues from
the prompt's last position, exactly as generation continues. The video's pixels appear once per packed row.

Scoring uses TRL's fused LM head with pre-shifted ``shift_labels``: a segment's token ``j`` is labelled with
answer token ``j``. :meth:`PackedRows.unpack` puts the per-token values back into the plain ``(rows,
completion_length)`` layout, with zeros where the completion mask is zero, as the plain path returns.

Exact for attention layers: every answer token sees exactly the keys and positions it sees in its own row.
Layers that carry a state along the sequence (Qwen3.5's Gated DeltaNet) would let segment 2 read segment 1
through it; for the layer types the family lists in ``forkable_state``, the packed inputs carry a
:class:`video_grpo.inputs.state_fork.StateFork` (``state_fork=``), and those layers run the stem once and start each
segment from a copy of its final state. Any other stateful layer type is refused by :func:`unsupported_reason`,
and the trainer refuses or falls back. Rows whose layout is not "left-padded prompt, right-padded completion"
are returned as ``None`` so the caller runs them the plain way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from video_grpo.inputs.processing import TIME_INPUTS, concat, video_token_types

SUPPORTED_ATTENTION = ("sdpa", "eager")  # take a custom 4-D mask as it is


def stateful_layers(config) -> list[str]:
    """Layer types that carry a state along the sequence (Qwen3.5's Gated DeltaNet ``linear_attention``)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = set(getattr(text_config, "layer_types", None) or [])
    return sorted(kinds - {"full_attention", "sliding_attention"})


def forkable_state(config) -> bool:
    """Whether the model has stateful layers and its family forks all of them (:mod:`video_grpo.inputs.state_fork`)."""
    stateful = stateful_layers(config)
    return bool(stateful) and not unforkable_layers(config)


def unforkable_layers(config) -> list[str]:
    """Stateful layer types the model's family cannot fork after a shared prompt."""
    from video_grpo.inputs.families import detect_family

    try:
        forkable = set(detect_family(config).forkable_state)
    except ValueError:  # not a supported family: nothing is known to be forkable
        forkable = set()
    return [kind for kind in stateful_layers(config) if kind not in forkable]


def unsupported_reason(config, attn_implementation: str | None = None) -> str | None:
    """Why a packed shared-prefix forward cannot be exact for this model and attention backend, or None."""
    stateful = unforkable_layers(config)
    if stateful:
        return (
            f"{config.model_type} has {stateful} layers, which carry a state along the sequence, and "
            "video_grpo.inputs.state_fork cannot fork it, so in a packed row one answer would read another through it"
        )
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if "sliding_attention" in (getattr(text_config, "layer_types", None) or []):
        return "sliding-window layers ignore a custom attention mask"
    implementation = attn_implementation or getattr(config, "_attn_implementation", None) or "sdpa"
    if implementation not in SUPPORTED_ATTENTION:
        return (
            f"attn_implementation={implementation!r} takes no custom 4-D attention mask; shared_prefix needs "
            f"{' or '.join(SUPPORTED_ATTENTION)}"
        )
    return None


def group_rows(
    prompts: Sequence[tuple[int, ...]], videos: Sequence[torch.Tensor], extras: Sequence[tuple]
) -> list[list[int]]:
    """Row indices grouped by identical prompt tokens and identical video (same tensor, or equal values), in
    first-seen order. ``extras`` holds what else must match (grid, time)."""
    groups: list[list[int]] = []
    for row, (prompt, video, extra) in enumerate(zip(prompts, videos, extras, strict=True)):
        for group in groups:
            first = group[0]
            if (
                prompts[first] == prompt
                and extras[first] == extra
                and (
                    videos[first] is video
                    or (videos[first].shape == video.shape and torch.equal(videos[first], video))
                )
            ):
                group.append(row)
                break
        else:
            groups.append([row])
    return groups


@dataclass
class PackedRows:
    """A micro-batch packed by prompt: ``model_inputs`` and ``shift_labels`` go to the model's fused forward."""

    model_inputs: dict[str, Any]
    shift_labels: torch.Tensor  # (packed rows, length)
    source: (
        torch.Tensor
    )  # (rows, completion_length, 2): packed row and position of each completion token; -1 unused
    plain_positions: int  # token positions the plain forward would carry
    packed_positions: int  # token positions this forward carries (padding included)

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token values on the packed rows -> the plain ``(rows, completion_length)`` layout."""
        used = self.source[..., 0] >= 0
        rows, positions = self.source[..., 0].clamp(min=0), self.source[..., 1].clamp(min=0)
        return values[rows, positions].masked_fill(~used, 0)


def _span(mask: torch.Tensor, left_padded: bool) -> tuple[int, int] | None:
    """(start, end) of the ones in a 0/1 row if they form one block at the expected end, else None."""
    ones = mask.nonzero().flatten()
    if ones.numel() == 0:
        return (mask.numel(), mask.numel()) if left_padded else (0, 0)
    start, end = int(ones[0]), int(ones[-1]) + 1
    if (
        end - start != ones.numel()
        or (left_padded and end != mask.numel())
        or (not left_padded and start != 0)
    ):
        return None
    return start, end


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    video_rows: dict[str, Any],
    rows: slice,
    rope_index: Callable,
    video_token_id: int,
    pad_token_id: int,
    mask_dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    fork_state: bool = False,
) -> PackedRows | None:
    """Pack ``input_ids`` (prompt left-padded, completion of ``completion_length`` right-padded), whose video
    inputs are ``video_rows[...][rows]``, by shared prompt. ``rope_index`` is the model's ``get_rope_index``.

    ``mask_dtype``: None for a boolean mask (sdpa), or the float dtype of an additive mask (eager attention:
    the model's dtype, so bf16 scores are not promoted to float32). ``device``: where the model inputs go
    (default ``input_ids``' device). The layout is worked out on the CPU from O(length) segment ids; the
    O(length²) mask is built on ``device`` only. ``fork_state``: the model has stateful layers its family forks
    (:func:`forkable_state`); the inputs then carry the segment layout as ``state_fork``. Returns None when
    the layout is not the expected one."""
    device = input_ids.device if device is None else torch.device(device)
    prompt_width = input_ids.shape[1] - completion_length
    prompts, answers = [], []
    for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
        prompt_span = _span(torch.tensor(mask[:prompt_width]), left_padded=True)
        answer_span = _span(torch.tensor(mask[prompt_width:]), left_padded=False)
        if prompt_span is None or answer_span is None or prompt_span[1] - prompt_span[0] < 2:
            return None
        prompts.append(tuple(ids[prompt_span[0] : prompt_width]))
        answers.append(ids[prompt_width : prompt_width + answer_span[1]])
    videos = video_rows["video_pixels"][rows]
    grids = video_rows["video_grid_thw"][rows]
    time = {key: video_rows[key][rows] for key in TIME_INPUTS if key in video_rows}
    extras = [(tuple(grids[i].tolist()), *(float(t[i]) for t in time.values())) for i in range(len(prompts))]
    groups = group_rows(prompts, videos, extras)

    sequences, segment_ids, positions, labels = [], [], [], []
    source = torch.full((len(prompts), completion_length, 2), -1, dtype=torch.long)
    for packed_row, group in enumerate(groups):
        first = group[0]
        prompt = torch.tensor(prompts[first], dtype=torch.long)
        # Positions are integers computed from O(P) inputs: on the CPU, with no device round trip
        prompt_positions, _ = rope_index(
            input_ids=prompt[None],
            mm_token_type_ids=video_token_types(prompt[None], video_token_id),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            video_grid_thw=grids[first : first + 1].cpu(),
            **{key: value[first : first + 1].cpu() for key, value in time.items()},
        )
        prompt_positions = prompt_positions[:, 0].cpu()  # (3, P)
        stem = len(prompt) - 1
        tokens, segment, position, label = (
            [prompt[:stem]],
            [torch.full((stem,), -1)],
            [prompt_positions[:, :stem]],
            [torch.full((stem,), -100)],
        )
        last_position = prompt_positions[:, stem : stem + 1]
        offset = stem
        for number, row in enumerate(group):
            answer = torch.tensor(answers[row], dtype=torch.long)
            if answer.numel() == 0:
                continue  # nothing to score; the plain path returns zeros for this row
            length = answer.numel()
            tokens.append(torch.cat([prompt[stem:], answer[:-1]]))
            segment.append(torch.full((length,), number))
            position.append(last_position + torch.arange(length))
            label.append(answer)
            source[row, :length, 0] = packed_row
            source[row, :length, 1] = torch.arange(offset, offset + length)
            offset += length
        sequences.append(torch.cat(tokens))
        segment_ids.append(torch.cat(segment))
        positions.append(torch.cat(position, dim=1))
        labels.append(torch.cat(label))

    width = max(len(s) for s in sequences)
    count = len(sequences)
    packed_ids = torch.full((count, width), pad_token_id, dtype=torch.long)
    packed_segments = torch.full((count, width), -2, dtype=torch.long)  # -1 stem, >= 0 answer, -2 padding
    packed_positions = torch.zeros((3, count, width), dtype=torch.long)
    packed_labels = torch.full((count, width), -100, dtype=torch.long)
    for i, (seq, seg, pos, lab) in enumerate(zip(sequences, segment_ids, positions, labels, strict=True)):
        packed_ids[i, : len(seq)], packed_segments[i, : len(seq)] = seq, seg
        packed_positions[:, i, : len(seq)], packed_labels[i, : len(seq)] = pos, lab
        if len(seq) < width:  # padding continues the positions, so rotary inputs stay ordinary numbers
            packed_positions[:, i, len(seq) :] = pos[:, -1:] + 1 + torch.arange(width - len(seq))
    allowed = segment_mask(packed_segments.to(device))
    if mask_dtype is not None:
        allowed = torch.zeros(allowed.shape, dtype=mask_dtype, device=device).masked_fill(
            ~allowed, torch.finfo(mask_dtype).min
        )
    first_rows = [group[0] for group in groups]
    model_inputs = {
        "input_ids": packed_ids.to(device),
        "attention_mask": allowed,
        "position_ids": packed_positions.to(device),
        "pixel_values_videos": concat([videos[i] for i in first_rows]).to(device),  # each prompt's video once
        "video_grid_thw": grids[first_rows].to(device),
        **{key: value[first_rows].to(device) for key, value in time.items()},
        "mm_token_type_ids": video_token_types(packed_ids, video_token_id).to(device),
    }
    if fork_state:
        from video_grpo.inputs import state_fork

        state_fork.install()
        model_inputs["state_fork"] = state_fork.layout(packed_segments).to(device)
    return PackedRows(
        model_inputs,
        packed_labels.to(device),
        source.to(device),
        plain_positions=input_ids.numel(),
        packed_positions=packed_ids.numel(),
    )


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """(rows, 1, L, L) boolean mask from per-position segment ids (-1 stem, >= 0 answer, -2 padding): a query
    sees earlier-or-equal keys of the stem and of its own segment. Padding sees earlier padding and itself, so
    no row of the mask is empty (an all-masked row would give NaN in sdpa)."""
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    query, key = segments[:, :, None], segments[:, None, :]
    allowed = causal & ((key == -1) | (key == query))
    return allowed[:, None]
