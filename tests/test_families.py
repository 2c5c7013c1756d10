"""The trainer tests that matter, for every model family: Qwen2.5-VL (tests/test_trainer.py, test_encoder.py and
the launched runs cover it), Qwen3-VL and Qwen3.5. Video reaches the loss and plain TRL drops it; the prompt text
and the 3-D positions of the loss equal generation's; the "<t seconds>" text is the frames' real times (a
variable-frame-rate file); encoding each video once is exact, DeepStack included; the family registry."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor
from trl import GRPOTrainer

from video_grpo.data.dataset import build_dataset
from video_grpo.data.video import SamplingConfig
from video_grpo.inputs.encoder import install
from video_grpo.inputs.families import FAMILIES, detect_family
from video_grpo.inputs.processing import encode_rows, generation_inputs

from .test_encoder import logps_and_grads
from .test_trainer import (
    ForwardProbe,
    FramesInPromptTransform,
    assert_loss_positions_equal_generation,
    changed,
    make_trainer,
    vision_snapshot,
)
from .test_video_formats import ffmpeg

QWEN3 = ["qwen3_vl", "qwen3_5"]


def sampling_for(family: str, **overrides) -> SamplingConfig:
    """Small frames of the family's geometry: 2x2 tokens of 28 px (Qwen2.5-VL) or 32 px (Qwen3)."""
    side = FAMILIES[family].size_multiple
    settings = {
        "fps": 1.0,
        "min_frames": 2,
        "max_frames": 8,
        "min_pixels": side * side,
        "max_pixels": 4 * side * side,
        "max_tokens": 64,
        "size_multiple": side,
    }
    return SamplingConfig(**{**settings, **overrides})


def test_family_registry():
    for name, family in FAMILIES.items():
        assert detect_family(name) is family
    assert (FAMILIES["qwen2_5_vl"].pixels_per_token, FAMILIES["qwen3_vl"].pixels_per_token) == (
        28 * 28,
        32 * 32,
    )
    assert (
        FAMILIES["qwen2_5_vl"].time_input_keys == ("second_per_grid_ts",)
        and FAMILIES["qwen3_vl"].time_input_keys == ()
    )
    assert FAMILIES["qwen3_vl"].deepstack and not FAMILIES["qwen3_5"].deepstack
    with pytest.raises(
        ValueError, match="unsupported model type 'llava': video_grpo supports qwen2_5_vl, qwen3_5"
    ):
        detect_family("llava")


@pytest.mark.parametrize("family", QWEN3)
def test_video_reaches_the_loss_and_plain_trl_drops_it(family_model, train_file, tmp_path, family):
    model = family_model(family)
    ours = make_trainer(model, build_dataset(train_file, sampling=sampling_for(family)), tmp_path / "ours")
    probe, before = ForwardProbe(ours.model), vision_snapshot(ours.model)
    ours.train()
    assert probe.encoder_calls_with_grad >= 1 and changed(before, ours.model)

    plain_data = build_dataset(train_file, sampling=sampling_for(family))
    plain_data.set_transform(FramesInPromptTransform(sampling_for(family)))
    plain = make_trainer(model, plain_data, tmp_path / "plain", trainer_cls=GRPOTrainer)
    probe, before = ForwardProbe(plain.model), vision_snapshot(plain.model)
    plain.train()
    assert any(f["sees_video"] for f in probe.forwards if not f["grad"])  # generation sees the frames
    assert probe.encoder_calls_with_grad == 0 and not changed(before, plain.model)  # the loss does not


@pytest.mark.parametrize("family", QWEN3)
def test_prompt_text_and_positions_of_the_loss_equal_generation(family_model, train_file, tmp_path, family):
    data = build_dataset(train_file, sampling=sampling_for(family, max_frames=16))
    trainer = make_trainer(family_model(family), data, tmp_path, beta=0.04, num_iterations=2, max_steps=2)
    probe = ForwardProbe(trainer.model)
    trainer.train()
    assert_loss_positions_equal_generation(probe)
    tokenizer = trainer.processing_class.tokenizer
    prompt = tokenizer.decode(next(c for c in probe.rope_calls if not c["grad"])["input_ids"][0])
    assert re.search(r"<\d+\.\d seconds><\|vision_start\|><\|video_pad\|>", prompt)  # time is in the text
    # no extra start/end pair around the whole video (transformers 5.24's layout without prompt_text)
    assert not re.search(r"<\|vision_start\|><\d", prompt) and "<|vision_end|><|vision_end|>" not in prompt


def vfr_clip(folder):
    """6 s: 3 s at 5 fps, then 3 s at 30 fps; Matroska reports 30 fps for it, so index / fps is no time."""
    path = folder / "5then30.mkv"
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=96x64:rate=30:duration=4",
        "-vf",
        "setpts='if(lt(N,15),N*0.2,3+(N-15)/30)/TB'",
        "-frames:v",
        "106",
        "-fps_mode",
        "vfr",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        str(path),
    )
    return path


def test_qwen3_time_text_is_the_frames_real_presentation_times(family_model, tmp_path):
    import decord

    from video_grpo.data.dataset import VideoTransform

    clip = vfr_clip(tmp_path)
    row = VideoTransform(sampling_for("qwen3_vl", fps=2.0, max_frames=64, max_tokens=512))(
        {"video": [str(clip)], "sentence": ["a clock"], "duration": [6.0]}
    )
    row = {key: values[0] for key, values in row.items()}
    processor = AutoProcessor.from_pretrained(family_model("qwen3_vl"))
    encoded = encode_rows(processor, [row], FAMILIES["qwen3_vl"])
    text = processor.tokenizer.decode(encoded["prompt_ids"][0])
    written = re.findall(r"<(\d+\.\d) seconds>", text)

    reader = decord.VideoReader(str(clip))
    starts = reader.get_frame_timestamp(list(range(len(reader))))[:, 0]
    real = [float(starts[i] - starts[0]) for i in row["video_metadata"]["frames_indices"]]
    expected = [f"{(real[k] + real[k + 1]) / 2:.1f}" for k in range(0, len(real), 2)]
    assert len(real) == 12 and written == expected
    by_index = [
        f"{(a + b) / 2 / reader.get_avg_fps():.1f}"
        for a, b in zip(
            row["video_metadata"]["frames_indices"][::2],
            row["video_metadata"]["frames_indices"][1::2],
            strict=True,
        )
    ]
    assert written != by_index  # what index / container fps would have written: the test tells them apart


def family_batch(model_dir, train_file, family: str, group: int = 3):
    """Two videos of different lengths, ``group`` rows each, plus a random completion."""
    processor = AutoProcessor.from_pretrained(model_dir)
    rows = build_dataset(train_file, sampling=sampling_for(family)).__getitems__([0] * group + [5] * group)
    encoded = encode_rows(processor, rows, FAMILIES[family])
    config = AutoModelForImageTextToText.from_pretrained(model_dir).config
    inputs = generation_inputs(encoded, processor.tokenizer.pad_token_id, config.video_token_id)
    completion = torch.randint(20, 200, (len(rows), 6), generator=torch.Generator().manual_seed(0))
    input_ids = torch.cat([inputs["input_ids"], completion], dim=1)
    return {
        **inputs,
        "input_ids": input_ids,
        "attention_mask": torch.cat([inputs["attention_mask"], torch.ones_like(completion)], dim=1),
        "mm_token_type_ids": (input_ids == config.video_token_id).long() * 2,
    }


@pytest.mark.parametrize(("family", "frozen"), [("qwen3_vl", False), ("qwen3_vl", True), ("qwen3_5", False)])
def test_encode_once_is_exact(family_model, train_file, family, frozen):
    model_dir = family_model(family)
    batch = family_batch(model_dir, train_file, family)
    plain = AutoModelForImageTextToText.from_pretrained(model_dir)
    once = AutoModelForImageTextToText.from_pretrained(model_dir)
    if frozen:
        plain.model.visual.requires_grad_(False)
        once.model.visual.requires_grad_(False)
    hook = install(once, reuse_across_calls=frozen)
    logps_plain, grads_plain = logps_and_grads(plain, batch)
    logps_once, grads_once = logps_and_grads(once, batch)
    torch.testing.assert_close(logps_once, logps_plain, rtol=1e-5, atol=1e-5)
    assert grads_plain.keys() == grads_once.keys() and (not grads_plain) == frozen
    for name in grads_plain:
        torch.testing.assert_close(grads_once[name], grads_plain[name], rtol=1e-4, atol=1e-6)
    assert hook.stats.rows_encoded * 3 == hook.stats.rows_requested  # each video encoded once, not 3 times
    if (
        FAMILIES[family].deepstack and not frozen
    ):  # the DeepStack mergers got their gradient through the reuse
        assert any("deepstack" in name for name in grads_once)
    if frozen:  # a second forward takes everything, DeepStack levels included, from the cache
        with torch.no_grad():
            again = once(**batch).logits
        assert hook.stats.encoder_runs == 1
        torch.testing.assert_close(again, plain(**batch).logits)
