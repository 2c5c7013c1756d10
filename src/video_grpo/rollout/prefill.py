"""One prefill per prompt in ``generate``: the G rows that repeat a prompt decode from copies of one cache.

TRL (and ``evaluate --do_sample``, ``curate``) repeat each prompt once per answer and call ``generate`` on the
batch, so a 3,000-token video prompt is prefilled G times. :func:`generate` instead:

1. finds the rows that repeat a prompt (same token ids, mask and video);
2. runs the language model once per unique prompt, without its last token, into a cache;
3. copies each unique prompt's cache entry to its rows (:func:`select_cache_rows`: the attention layers' keys
   and values, and Qwen3.5's Gated DeltaNet layers' convolution and recurrent states), and the 3-D position
   offsets (``rope_deltas``) the prefill stored with it;
4. calls the model's own ``generate`` on the full rows with that cache and no pixels: it feeds each row's last
   prompt token and decodes as usual.

The cache holds exactly the keys, values and states the plain prefill computes for those positions (a linear-
attention layer zeroes left-padded positions, so its state after the padding is the unpadded prompt's), so greedy
answers are the same tokens (``tests/test_shared_prefix_generation.py``). Every call makes one prefill forward and one
``generate``, whatever the rows hold, so under ZeRO-3 every rank makes the same forward calls.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from video_grpo.inputs.prefix import group_rows
from video_grpo.inputs.processing import TIME_INPUTS, concat
from video_grpo.rollout.decode import CompiledDecodeFailed, CompiledDecoder


def language_backbone(model):
    """The model's ``...VLModel`` (vision tower + language model), under PEFT too."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def select_cache_rows(cache, index: torch.Tensor) -> None:
    """Keep rows ``index`` of every cache layer, in place. transformers 5.24's ``Cache.batch_select_indices`` fails
    on a linear-attention layer (``LinearAttentionLayer`` has no such method), so its convolution and recurrent
    states are selected with the linear-attention part of ``reorder_cache`` (an ``index_select``), and the keys and
    values of attention layers (or of the attention half of a combined layer) with ``batch_select_indices``.

    A layer it cannot select (a ``StaticLayer``: fixed-size tensors, no ``batch_select_indices``) is an error:
    skipping it would leave that layer with the wrong rows, and decoding would fail later, far from the cause
    (``index_copy_(): Source/destination tensor must have same slice shapes``). A static cache is filled by
    copying rows into it instead (:mod:`video_grpo.rollout.decode`)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin, StaticLayer

    for number, layer in enumerate(cache.layers):
        linear = isinstance(layer, LinearAttentionCacheLayerMixin)
        if isinstance(layer, StaticLayer) or not (linear or hasattr(layer, "batch_select_indices")):
            raise TypeError(
                f"select_cache_rows: cannot select rows of cache layer {number} ({type(layer).__name__}); "
                "a static layer is filled by copying rows into it (video_grpo.rollout.decode.CompiledDecoder.fill)."
            )
        if linear:
            LinearAttentionCacheLayerMixin.reorder_cache(layer, index)
        if hasattr(
            layer, "batch_select_indices"
        ):  # attention keys and values (absent on a linear-only layer)
            layer.batch_select_indices(index)


def unique_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    pixels: list[torch.Tensor],
    grids: torch.Tensor,
    time: dict[str, torch.Tensor],
) -> tuple[list[int], torch.Tensor]:
    """(first row of each distinct prompt, index from every row to its prompt)."""
    prompts = [
        tuple(ids[mask.bool()].tolist())
        for ids, mask in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)
    ]
    extras = [(tuple(grids[i].tolist()), *(float(t[i]) for t in time.values())) for i in range(len(prompts))]
    groups = group_rows(prompts, pixels, extras)
    index = torch.empty(len(prompts), dtype=torch.long)
    for number, group in enumerate(groups):
        index[group] = number
    return [group[0] for group in groups], index


@torch.no_grad()
def generate(
    model,
    generate_fn=None,
    *,
    counts: list[int] | None = None,
    decoder: CompiledDecoder | None = None,
    share: bool = True,
    **inputs: Any,
):
    """``model.generate(input_ids=..., ...)`` (``generate_fn``, default ``model.generate``) with each distinct
    left-padded prompt prefilled once. Rows must hold one video each (how every caller here builds them).
    ``inputs``: ``input_ids``, ``attention_mask``, ``pixel_values_videos``, ``video_grid_thw`` and
    ``mm_token_type_ids`` (required), ``video_index``, the time inputs and ``generate``'s own arguments (see
    :func:`_generate`, whose signature names them).

    ``video_index``: if given, ``pixel_values_videos`` holds each distinct video once (see
    :func:`video_grpo.inputs.processing.unique_videos`) and row ``r`` shows video ``video_index[r]``, so no row's copy of
    the pixels is made; ``video_grid_thw`` and the time inputs stay per row. Otherwise it holds one video per row.

    ``decoder``: decode from its static cache with its compiled step (:mod:`video_grpo.rollout.decode`). If the compiled
    path fails at any step (:class:`~video_grpo.rollout.decode.CompiledDecodeFailed`: a compile or capture error, a
    recompile storm), a ``decode_compile: true`` decoder stops the run with a clear error; otherwise the decoder
    turns itself off with one warning and the call is made again on the plain path, from the random state the
    failed call started from. Every other error (the prefill's, sampling's, an out-of-memory, device or collective
    error: :func:`~video_grpo.rollout.decode.must_propagate`) propagates as it is.
    ``share=False`` prefills every row itself (``shared_prefix: false`` with ``decode_compile`` on: the same forwards
    as plain ``generate``'s prefill, into a cache the decoder copies)."""
    if decoder is None or not decoder.enabled:
        return _generate(model, generate_fn, counts=counts, share=share, **inputs)
    counted = list(counts) if counts is not None else None
    random_state = _random_state(inputs["input_ids"].device)
    try:
        return _generate(model, generate_fn, counts=counts, share=share, decoder=decoder, **inputs)
    except CompiledDecodeFailed as err:
        if decoder.strict:
            raise decoder.failure_error(err) from err
        decoder.turn_off(err)
        if counts is not None:
            counts[:] = counted
        _restore_random_state(random_state)
        return _generate(model, generate_fn, counts=counts, share=share, **inputs)


def _random_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda, device


def _restore_random_state(state: tuple) -> None:
    cpu, cuda, device = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


def _generate(
    model,
    generate_fn=None,
    *,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    pixel_values_videos: torch.Tensor,
    video_grid_thw: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    video_index: torch.Tensor | None = None,
    counts: list[int] | None = None,
    decoder: CompiledDecoder | None = None,
    share: bool = True,
    **kwargs: Any,
):
    generate_fn = generate_fn or model.generate
    time = {key: kwargs.pop(key) for key in TIME_INPUTS if key in kwargs}
    if video_index is None:
        pixels = list(torch.split(pixel_values_videos, video_grid_thw.prod(-1).tolist()))
    else:
        rows_of = video_index.tolist()
        first_row_of = {video: rows_of.index(video) for video in sorted(set(rows_of))}
        videos = torch.split(
            pixel_values_videos, [int(video_grid_thw[row].prod()) for row in first_row_of.values()]
        )
        pixels = [videos[video] for video in rows_of]  # views: rows of one video hold the same object
    if share:
        first, index = unique_rows(input_ids, attention_mask, pixels, video_grid_thw, time)
    else:
        first, index = list(range(len(pixels))), torch.arange(len(pixels))
    shown = [pixels[i] for i in first]
    if video_index is not None and [rows_of[i] for i in first] == list(range(len(videos))):
        prefill_pixels = pixel_values_videos  # the distinct videos, in order: no copy
    elif video_index is None and first == list(range(len(pixels))):
        prefill_pixels = pixel_values_videos  # one video per row, every row prefilled: no copy
    else:
        prefill_pixels = concat(shown)
    backbone = language_backbone(model)
    # Only the cache is kept: the prefill's hidden states would otherwise stay alive through decoding
    cache = backbone(
        input_ids=input_ids[first, :-1],
        attention_mask=attention_mask[first, :-1],
        pixel_values_videos=prefill_pixels,
        video_grid_thw=video_grid_thw[first],
        mm_token_type_ids=mm_token_type_ids[first, :-1],
        **{key: value[first] for key, value in time.items()},
        use_cache=True,
    ).cache
    del shown, prefill_pixels, pixels
    if counts is not None:
        counts[0] += len(index)
        counts[1] += len(first)
    index = index.to(input_ids.device)
    if decoder is not None:
        return decoder.generate(
            model,
            generate_fn,
            cache,
            index,
            input_ids=input_ids,
            attention_mask=attention_mask,
            mm_token_type_ids=mm_token_type_ids,
            **kwargs,
        )
    select_cache_rows(cache, index)
    backbone.rope_deltas = backbone.rope_deltas[index]
    return generate_fn(
        input_ids=input_ids,
        attention_mask=attention_mask,
        mm_token_type_ids=mm_token_type_ids,
        cache=cache,
        **kwargs,
    )


@contextlib.contextmanager
def one_prefill_per_prompt(
    model, counts: list[int] | None = None, decoder: CompiledDecoder | None = None, share: bool = True
):
    """Within the block, ``model.generate`` (as TRL calls it) prefills each distinct prompt once. ``counts``, if
    given, gets [rows, rows prefilled] added for each call. ``decoder`` and ``share``: see :func:`generate`."""
    original = model.generate
    had_own = "generate" in vars(model)

    def shared_generate(*args, **kwargs):
        if args or "pixel_values_videos" not in kwargs or "mm_token_type_ids" not in kwargs:
            return original(*args, **kwargs)  # not a video batch built by our trainer
        return generate(model, original, counts=counts, decoder=decoder, share=share, **kwargs)

    model.generate = shared_generate
    try:
        yield
    finally:
        if had_own:
            model.generate = original
        else:
            del model.generate  # the class's method again
