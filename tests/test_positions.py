"""Qwen2.5-VL's 3-D positions follow Qwen's reference layout in the loss forward and in generation, with the
transformers version this project installs (5.24 places the text after a video inside the video's time range,
huggingface/transformers#45381).

The expected positions come from an independent statement of the reference rule, written here:
text tokens count up by one on all three axes; a video block starting at ``s`` gives the token of temporal
patch ``k``, row ``i``, column ``j`` the positions ``(s + floor(k * second_per_grid_ts * tokens_per_second),
s + i, s + j)``; the text after a block starts at the block's maximum over the three axes, plus one.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from video_grpo.data.dataset import build_dataset
from video_grpo.data.video import SamplingConfig
from video_grpo.inputs.families import QWEN2_5_VL
from video_grpo.inputs.processing import encode_rows, generation_inputs, video_kwargs

SAMPLING = SamplingConfig(
    fps=1.0, min_frames=2, max_frames=64, min_pixels=784, max_pixels=56 * 56, max_tokens=512
)


def reference_positions(
    ids: list[int], video_token_id: int, grid: list[int], seconds: float, tokens_per_second: int, merge: int
) -> torch.Tensor:
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    rows, position, i = [], 0, 0
    while i < len(ids):
        if ids[i] != video_token_id:
            rows.append((position, position, position))
            position, i = position + 1, i + 1
            continue
        block = [
            (position + math.floor(k * seconds * tokens_per_second), position + r, position + c)
            for k in range(t)
            for r in range(h)
            for c in range(w)
        ]
        rows += block
        i += len(block)
        position = max(max(p) for p in block) + 1
    return torch.tensor(rows).T


@pytest.fixture(scope="module")
def setup(tiny_model_dir, train_file):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    dataset = build_dataset(train_file, sampling=SAMPLING)
    durations = dataset.with_format(None)["duration"]
    rows = dataset.__getitems__([durations.index(max(durations))])  # the longest clip: many temporal patches
    return model, processor, rows


class LanguageModelPositions:
    """Records the position ids every language-model call receives (the 3 mrope rows)."""

    def __init__(self, model) -> None:
        self.calls: list[torch.Tensor] = []
        model.model.language_model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        positions = kwargs["position_ids"]
        self.calls.append(positions[-3:].clone())  # generation prepends a 1-D text row


def test_loss_forward_and_generation_use_the_reference_layout(setup):
    model, processor, rows = setup
    config = model.config
    encoded = encode_rows(processor, rows, QWEN2_5_VL)
    ids = encoded["prompt_ids"][0]
    grid = encoded["video_grid_thw"][0].tolist()
    seconds = float(encoded["second_per_grid_ts"][0])
    expected = reference_positions(
        ids,
        config.video_token_id,
        grid,
        seconds,
        config.vision_config.tokens_per_second,
        config.vision_config.spatial_merge_size,
    )
    video_end = len(ids) - ids[::-1].index(config.video_token_id)
    assert (
        grid[0] >= 8 and expected[0, video_end] > expected[0, video_end - 1]
    )  # a long clip: the rule matters here
    assert expected[:, video_end].tolist() == [int(expected[:, :video_end].max()) + 1] * 3

    probe = LanguageModelPositions(model)
    input_ids = torch.tensor([ids])
    with torch.no_grad():  # the loss forward's path: video_kwargs, as VideoGRPOTrainer builds it
        model(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            **video_kwargs(encoded, slice(0, 1), input_ids, config.video_token_id),
        )
    assert torch.equal(probe.calls[-1][:, 0], expected)

    probe.calls.clear()
    inputs = generation_inputs(encoded, processor.tokenizer.pad_token_id, config.video_token_id)
    with torch.no_grad():
        model.generate(**inputs, max_new_tokens=3, do_sample=False, min_new_tokens=3)
    prefill, *decoded = probe.calls
    assert torch.equal(prefill[:, 0], expected)
    last = int(expected.max())
    assert [call[:, 0, -1].tolist() for call in decoded] == [
        [last + 1] * 3,
        [last + 2] * 3,
    ]  # decoding continues


def test_left_padded_rows_get_the_same_positions(setup):
    model, processor, rows = setup
    encoded = encode_rows(processor, rows + rows, QWEN2_5_VL)
    shorter = {**encoded, "prompt_ids": [encoded["prompt_ids"][0][3:], encoded["prompt_ids"][1]]}
    inputs = generation_inputs(shorter, processor.tokenizer.pad_token_id, model.config.video_token_id)
    positions, deltas = model.model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"],
        attention_mask=inputs["attention_mask"],
    )
    # Row 0 lost 3 leading text tokens and is left-padded by 3: after the pads, its positions are row 1's minus 3.
    assert torch.equal(positions[:, 0, 3:], positions[:, 1, 3:] - 3)
    assert torch.equal(deltas[0], deltas[1])
