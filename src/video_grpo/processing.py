"""Turn grounding rows (prompt + sampled frames + metadata) into model inputs, for every model family.

One function shared by training and evaluation, so both see the same tokens, pixels and time. What differs
between Qwen2.5-VL, Qwen3-VL and Qwen3.5 comes from :mod:`video_grpo.families`.

Video input policy: :func:`encode_rows` makes the video half of every forward once, on the CPU, and
nothing changes it afterwards except its device.

- ``pixel_values_videos``: float32, the processor's normalised values. The model casts them to the vision
  tower's dtype itself (``get_video_features``), the same way in every forward.
- ``second_per_grid_ts`` (Qwen2.5-VL only): float32, from the sampled frames' real timestamps. Never cast to
  bf16: 0.99955 s would become 1.0 and move every frame's time position. (Qwen3 families carry time in the
  prompt text, as integers' worth of tokens, so nothing can round it.)
- ``video_grid_thw``: int64; ``mm_token_type_ids``: rebuilt from the token ids in every forward.

Under DeepSpeed, ``Trainer._prepare_input`` casts every float tensor on its way to generation (and only
there) to the engine's dtype; ``VideoGRPOTrainer._prepare_input`` exempts :data:`VIDEO_FLOAT_INPUTS` from
that cast, so generation and the old-policy, reference and loss forwards see bit-identical video inputs.
"""

from __future__ import annotations

from typing import Any

import torch

from video_grpo import positions
from video_grpo.families import ModelFamily

positions.install()  # every Qwen2.5-VL forward and generation uses the reference 3-D position layout

VIDEO_FLOAT_INPUTS = frozenset({"pixel_values_videos", "second_per_grid_ts"})
TIME_INPUTS = (
    "second_per_grid_ts",
)  # per-video time tensors some families take (ModelFamily.time_input_keys)


def encode_rows(
    processor, rows: list[dict], family: ModelFamily, chat_template_kwargs: dict | None = None
) -> dict[str, Any]:
    """Tokenize each row's prompt with its video; rows that share a video and prompt are processed once.

    Returns per-row ``prompt_ids`` (lists), ``video_pixels`` (a list of ``(patches, C)`` float32 tensors, shared
    by identical rows), ``video_grid_thw`` ``(B, 3)`` and the family's time inputs (Qwen2.5-VL:
    ``second_per_grid_ts`` ``(B,)``). The frames were already sampled and sized by :mod:`video_grpo.video`, so
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
    return {
        "prompt_ids": [list(encoded["input_ids"][u]) for u in row_to_unique],
        "video_pixels": [pixels[u] for u in row_to_unique],
        "video_grid_thw": grid[row_to_unique],
        **{key: value[row_to_unique] for key, value in time.items()},
    }


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
        "pixel_values_videos": torch.cat(encoded["video_pixels"][rows]).to(
            device
        ),  # device only: see the policy
        "video_grid_thw": encoded["video_grid_thw"][rows].to(device),
        **{key: encoded[key][rows].to(device) for key in TIME_INPUTS if key in encoded},
        "mm_token_type_ids": video_token_types(input_ids, video_token_id),
    }


def generation_inputs(encoded: dict[str, Any], pad_token_id: int, video_token_id: int, device=None) -> dict:
    """Left-padded ``generate`` kwargs for rows encoded by :func:`encode_rows`."""
    prompts = [torch.tensor(ids) for ids in encoded["prompt_ids"]]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, ids in enumerate(prompts):
        input_ids[i, width - len(ids) :] = ids
        attention_mask[i, width - len(ids) :] = 1
    if device is not None:
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        **video_kwargs(encoded, slice(None), input_ids, video_token_id),
    }
