"""Turn grounding rows (prompt + sampled frames + metadata) into model inputs, for every model family.

One function shared by training and evaluation, so both see the same tokens, pixels and time. What differs
between Qwen2.5-VL, Qwen3-VL and Qwen3.5 comes from :mod:`video_grpo.inputs.families`.

Video input policy: :func:`encode_rows` makes the video half of every forward once, on the CPU, and
nothing changes it afterwards except its device.

- ``pixel_values_videos``: float32, the processor's normalised values. The model casts them to the vision
  tower's dtype itself (``get_video_features``), the same way in every forward.
- ``second_per_grid_ts`` (Qwen2.5-VL only): float32, from the sampled frames' real timestamps. Never cast to
  bf16: 0.99955 s would become 1.0 and move every frame's time position. (Qwen3 families carry time in the
  prompt text, as integers' worth of tokens, so nothing can round it.)
- ``video_grid_thw``: int64; ``mm_token_type_ids``: rebuilt from the token ids in every forward.

Under DeepSpeed, ``Trainer._prepare_input`` casts every float tensor it moves (GRPO's generation inputs,
every SFT batch) to the engine's dtype. :class:`KeepVideoDtype`, which every trainer of ours inherits, exempts
:data:`VIDEO_FLOAT_INPUTS` from that cast, so generation, the old-policy, reference and loss forwards and the
SFT cold start see bit-identical video inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from video_grpo.inputs import positions
from video_grpo.inputs.families import VIDEO_PAD, ModelFamily

positions.install()  # every Qwen2.5-VL forward and generation uses the reference 3-D position layout

VIDEO_FLOAT_INPUTS = frozenset({"pixel_values_videos", "second_per_grid_ts"})
TIME_INPUTS = (
    "second_per_grid_ts",
)  # per-video time tensors some families take (ModelFamily.time_input_keys)


class KeepVideoDtype:
    """Mixin for a ``transformers.Trainer``: :data:`VIDEO_FLOAT_INPUTS` only change device in ``_prepare_input``.

    Why: under DeepSpeed, ``Trainer._prepare_input`` casts every float tensor to the engine's dtype (bf16), so
    ``second_per_grid_ts`` = 0.9993 would reach the model as 1.0 and move every frame's time position, in GRPO's
    generation and in every SFT step alike. The model casts the pixels to its vision tower's dtype itself."""

    def _prepare_input(self, data):
        if isinstance(data, Mapping) and not VIDEO_FLOAT_INPUTS.isdisjoint(data):
            return type(data)(
                {
                    key: value.to(self.args.device)
                    if key in VIDEO_FLOAT_INPUTS and isinstance(value, torch.Tensor)
                    else self._prepare_input(value)
                    for key, value in data.items()
                }
            )
        return super()._prepare_input(data)


def encode_rows(
    processor, rows: list[dict], family: ModelFamily, chat_template_kwargs: dict | None = None
) -> dict[str, Any]:
    """Tokenize each row's prompt with its video; rows that share a video and prompt are processed once.

    Returns per-row ``prompt_ids`` (lists), ``video_pixels`` (a list of ``(patches, C)`` float32 tensors, shared
    by identical rows), ``video_grid_thw`` ``(B, 3)`` and the family's time inputs (Qwen2.5-VL:
    ``second_per_grid_ts`` ``(B,)``). The frames were already sampled and sized by :mod:`video_grpo.data.video`, so
    the processor neither resamples nor resizes them; time comes from the frames' real timestamps.
    """
    texts = processor.apply_chat_template(
        [row["prompt"] for row in rows],
        tokenize=False,
        add_generation_prompt=True,
        **(chat_template_kwargs or {}),
    )
    unique: dict[tuple[int, str], int] = {}
    row_to_unique = [
        unique.setdefault((id(row["video_frames"]), text), len(unique))
        for row, text in zip(rows, texts, strict=True)
    ]
    first_row = {}
    for row_index, unique_index in enumerate(row_to_unique):
        first_row.setdefault(unique_index, row_index)
    order = [first_row[u] for u in range(len(unique))]
    encoded = processor(
        text=[family.prompt_text(texts[i]) for i in order],
        videos=[rows[i]["video_frames"] for i in order],
        video_metadata=[family.processor_metadata(rows[i]["video_metadata"]) for i in order],
        do_sample_frames=False,
        do_resize=False,
        cap_pixels_per_frame=True,  # explicit, to silence a transformers warning; frames are pre-sized anyway
    )
    grid = torch.as_tensor(encoded["video_grid_thw"]).long()
    pixels = torch.split(
        torch.as_tensor(encoded["pixel_values_videos"], dtype=torch.float32), grid.prod(-1).tolist()
    )
    time = family.time_inputs([rows[i]["video_metadata"] for i in order])
    prompt_ids = [list(ids) for ids in encoded["input_ids"]]
    if family.text_timestamps:  # TimeLens-7B: each temporal patch led by its time (families.py)
        video_token_id = processor.tokenizer.convert_tokens_to_ids(VIDEO_PAD)
        prompt_ids = [
            family.interleave_timestamps(
                ids, grid[u], rows[order[u]]["video_metadata"], processor.tokenizer, video_token_id
            )
            for u, ids in enumerate(prompt_ids)
        ]
    return {
        "prompt_ids": [prompt_ids[u] for u in row_to_unique],
        "video_pixels": [pixels[u] for u in row_to_unique],
        "video_grid_thw": grid[row_to_unique],
        **{key: value[row_to_unique] for key, value in time.items()},
    }


def concat(tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``torch.cat``, with no copy for a single tensor. A video's pixels are GBs at full size and nothing writes
    to them in place, so one video is passed on as it is."""
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors))


def unique_videos(per_row: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(each distinct tensor once, in first-seen order; the index of every row's tensor in that list). Rows of
    one prompt share one pixel tensor (:func:`video_grpo.inputs.processing.encode_rows`), so identity finds them."""
    position: dict[int, int] = {}
    videos: list[torch.Tensor] = []
    index = []
    for tensor in per_row:
        if id(tensor) not in position:
            position[id(tensor)] = len(videos)
            videos.append(tensor)
        index.append(position[id(tensor)])
    return videos, torch.tensor(index, dtype=torch.long)


def video_row_keys(family: ModelFamily) -> tuple[str, ...]:
    """The :func:`encode_rows` entries that travel with each row through the trainer."""
    return ("video_pixels", "video_grid_thw", *family.time_input_keys)


VIDEO_TOKEN_TYPE = 2  # mm_token_type_ids in every family: 0 text, 1 image, 2 video


def vision_placeholder_ids(config) -> list[int]:
    """Token ids that must never be generated: a sampled ``<|video_pad|>`` breaks the next forward."""
    candidates = [
        getattr(config, name, None)
        for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    ]
    return sorted({i for i in candidates if i is not None})


def video_token_types(input_ids: torch.Tensor, video_token_id: int) -> torch.Tensor:
    """``mm_token_type_ids``: without them Qwen2.5-VL silently falls back to 1-D text positions (Qwen3 raises)."""
    return (input_ids == video_token_id).long() * VIDEO_TOKEN_TYPE


def video_kwargs(encoded: dict[str, Any], rows: slice, input_ids: torch.Tensor, video_token_id: int) -> dict:
    """The video half of a forward's inputs for ``rows`` of an :func:`encode_rows` result, on ``input_ids``'
    device; ``input_ids`` are those rows' (padded) token ids."""
    device = input_ids.device
    return {
        "pixel_values_videos": concat(encoded["video_pixels"][rows]).to(
            device
        ),  # device only: see the policy
        "video_grid_thw": encoded["video_grid_thw"][rows].to(device),
        **{key: encoded[key][rows].to(device) for key in TIME_INPUTS if key in encoded},
        "mm_token_type_ids": video_token_types(input_ids, video_token_id),
    }


def generation_inputs(
    encoded: dict[str, Any], pad_token_id: int, video_token_id: int, device=None, one_copy_per_video=False
) -> dict:
    """Left-padded ``generate`` kwargs for rows encoded by :func:`encode_rows`.

    ``one_copy_per_video``: ``pixel_values_videos`` holds each distinct video once, and ``video_index`` says
    which one each row shows (the form :func:`video_grpo.rollout.prefill.generate` takes), instead of one copy per row."""
    prompts = [torch.tensor(ids) for ids in encoded["prompt_ids"]]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, ids in enumerate(prompts):
        input_ids[i, width - len(ids) :] = ids
        attention_mask[i, width - len(ids) :] = 1
    if device is not None:
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    if not one_copy_per_video:
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            **video_kwargs(encoded, slice(None), input_ids, video_token_id),
        }
    videos, index = unique_videos(encoded["video_pixels"])
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        **video_kwargs({**encoded, "video_pixels": videos}, slice(None), input_ids, video_token_id),
        "video_index": index.to(input_ids.device),
    }
