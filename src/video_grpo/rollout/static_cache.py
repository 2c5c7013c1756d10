"""The static cache's layers, filled from a prefill's ``DynamicCache``: what :class:`video_grpo.rollout.decode.CompiledDecoder`
copies row by row after the one prefill per prompt, for attention layers (keys and values) and Qwen3.5's Gated
DeltaNet layers (convolution and recurrent states). A layer kind it does not know is an error, never a skipped
layer: a skipped layer would decode from zeros."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # video_grpo.decode imports this module, and the planner reads decode without torch
    import torch


def layer_kind(layer) -> str:
    """``attention``, ``linear`` (Gated DeltaNet states) or the class name of a layer this module cannot copy."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionLayer, StaticLayer

    if type(layer) in (DynamicLayer, StaticLayer):
        return "attention"
    if type(layer) is LinearAttentionLayer:
        return "linear"
    return type(layer).__name__


def layer_initialized(layer) -> bool:
    if layer_kind(layer) == "attention":
        return layer.is_initialized
    return any(layer.is_conv_states_initialized.values()) or any(
        layer.is_recurrent_states_initialized.values()
    )


def init_layer(static, dynamic, rows: int) -> None:
    """Allocate a static layer for ``rows`` rows with the prefill layer's heads, sizes, dtype and device."""
    kinds = (layer_kind(static), layer_kind(dynamic))
    if kinds == ("attention", "attention"):
        keys, values = dynamic.keys, dynamic.values
        static.lazy_initialization(
            keys[:1].expand(rows, *keys.shape[1:]), values[:1].expand(rows, *values.shape[1:])
        )
    elif kinds == ("linear", "linear"):
        for i in range(dynamic.number_of_states):
            conv, recurrent = dynamic.conv_states[i], dynamic.recurrent_states[i]
            static.lazy_initialization(
                conv_states=None if conv is None else conv[:1].expand(rows, *conv.shape[1:]),
                recurrent_states=None
                if recurrent is None
                else recurrent[:1].expand(rows, *recurrent.shape[1:]),
                state_idx=i,
                conv_kernel_size=dynamic.conv_kernel_size[i],
            )
    else:
        raise NotImplementedError(
            f"decode_compile: cannot copy a {kinds[1]} cache layer into a {kinds[0]} static layer"
        )


def row_view(cache, rows: int):
    """A cache whose layers hold the first ``rows`` rows of ``cache``'s tensors (views, marked as static addresses
    as transformers marks its own), with their own write positions."""
    view = copy.copy(cache)
    view.layers = []
    for layer in cache.layers:
        part = copy.copy(layer)
        if layer_kind(layer) == "attention":
            part.keys, part.values = layer.keys[:rows], layer.values[:rows]
            part.batch_size = rows
            part.cumulative_length = layer.cumulative_length.clone()
            tensors = [part.keys, part.values, part.cumulative_length]
        else:
            part.conv_states = {i: s if s is None else s[:rows] for i, s in layer.conv_states.items()}
            part.recurrent_states = {
                i: s if s is None else s[:rows] for i, s in layer.recurrent_states.items()
            }
            part.has_previous_state = dict(layer.has_previous_state)
            tensors = [*part.conv_states.values(), *part.recurrent_states.values()]
        import torch

        for tensor in tensors:
            if tensor is not None:
                torch._dynamo.mark_static_address(tensor)
        view.layers.append(part)
    return view


def fill_layer(static, dynamic, index: torch.Tensor, length: int) -> None:
    """Copy rows ``index`` of the prefill layer into ``static`` (its first ``length`` positions; the rest zeroed),
    then free the prefill layer's tensors."""
    kind = layer_kind(static)
    if kind == "attention":
        static.keys[:, :, :length].copy_(dynamic.keys[index])
        static.keys[:, :, length:].zero_()
        static.values[:, :, :length].copy_(dynamic.values[index])
        static.values[:, :, length:].zero_()
        static.cumulative_length.fill_(length)
        dynamic.keys = dynamic.values = None  # the prefill's copy is no longer needed
    else:
        for i in range(static.number_of_states):
            if static.is_conv_states_initialized[i]:
                static.conv_states[i].copy_(dynamic.conv_states[i][index])
                dynamic.conv_states[i] = None
            if static.is_recurrent_states_initialized[i]:
                static.recurrent_states[i].copy_(dynamic.recurrent_states[i][index])
                dynamic.recurrent_states[i] = None
            static.has_previous_state[i] = True
