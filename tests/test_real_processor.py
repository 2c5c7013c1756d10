"""The real Qwen2.5-VL-7B processor and chat template (from ../shared/reference; skipped when absent)."""

from __future__ import annotations

import pytest
from transformers import AutoProcessor

from video_grpo.data.dataset import build_dataset
from video_grpo.data.video import SamplingConfig, sampled_fps
from video_grpo.inputs.families import QWEN2_5_VL
from video_grpo.inputs.processing import encode_rows

from .conftest import REFERENCE

QWEN_DIR = REFERENCE / "qwen2_5_vl"
pytestmark = pytest.mark.skipif(
    not (QWEN_DIR / "tokenizer_config.json").is_file(), reason=f"{QWEN_DIR} absent"
)


@pytest.fixture(scope="module")
def processor():
    return AutoProcessor.from_pretrained(QWEN_DIR)


def test_one_video_block_and_token_count(processor, train_file):
    sampling = SamplingConfig(fps=1.0, max_frames=16, min_pixels=784, max_pixels=112 * 112, max_tokens=1024)
    rows = build_dataset(train_file, sampling=sampling).__getitems__([0, 0, 3])
    encoded = encode_rows(processor, rows, QWEN2_5_VL)
    tok = processor.tokenizer
    start, pad, end = (
        tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>")
    )
    assert (start, pad, end) == (151652, 151656, 151653)  # the real ids
    for i, ids in enumerate(encoded["prompt_ids"]):
        assert ids.count(start) == 1 and ids.count(end) == 1
        s, e = ids.index(start), ids.index(end)
        assert set(ids[s + 1 : e]) == {pad}  # one contiguous <|video_pad|> run inside the block
        assert ids.count(pad) == e - s - 1 == int(encoded["video_grid_thw"][i].prod()) // 4
        assert encoded["second_per_grid_ts"][i].item() == pytest.approx(
            2 / sampled_fps(rows[i]["video_metadata"])
        )
    text = tok.decode(encoded["prompt_ids"][0])
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert 'To accurately pinpoint the event "a red circle moves across the screen"' in text
    assert encoded["video_pixels"][0] is encoded["video_pixels"][1]  # repeated rows share one processed video
