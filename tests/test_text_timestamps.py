"""Textual frame timestamps on Qwen2.5-VL (TimeLens-7B; ``frame_timestamps_in_text``, video_grpo.inputs.families): the
prompt carries each temporal patch's time before its own vision block; positions and logits equal those of the
same prompt given one one-patch grid per block (the form a processor that splits the video would hand the model);
training runs with it and the loss sees generation's prompt and positions."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from video_grpo.data.dataset import build_dataset
from video_grpo.inputs.families import FAMILIES, QWEN2_5_VL
from video_grpo.inputs.processing import encode_rows, generation_inputs

from .test_families import sampling_for
from .test_trainer import ForwardProbe, assert_loss_positions_equal_generation, make_trainer

TEXT_TIME = QWEN2_5_VL.with_text_timestamps()


@pytest.fixture(scope="module")
def rows(train_file):
    data = build_dataset(train_file, sampling=sampling_for("qwen2_5_vl", max_frames=8))
    return data.__getitems__([0, 5])


def test_prompt_carries_each_patch_time(tiny_model_dir, rows):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    tokenizer = processor.tokenizer
    plain, timed = encode_rows(processor, rows, QWEN2_5_VL), encode_rows(processor, rows, TEXT_TIME)
    for row, plain_ids, ids, grid in zip(
        rows, plain["prompt_ids"], timed["prompt_ids"], timed["video_grid_thw"], strict=True
    ):
        text = tokenizer.decode(ids)
        t, h, w = grid.tolist()
        times = row["video_metadata"]["timestamps"]
        expected = [f"{(times[k] + times[k + 1]) / 2:.1f}" for k in range(0, len(times), 2)]
        assert (
            re.findall(r"<(\d+\.\d) seconds><\|vision_start\|>", text) == expected and len(expected) == t > 1
        )
        assert text.count("<|vision_start|>") == text.count("<|vision_end|>") == t
        assert (
            text.count("<|video_pad|>")
            == tokenizer.decode(plain_ids).count("<|video_pad|>")
            == t * h * w // 4
        )
        assert "seconds>" not in tokenizer.decode(plain_ids)
        # spliced pieces tokenize as the whole text does
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    assert torch.equal(plain["video_grid_thw"], timed["video_grid_thw"])  # the video itself is unchanged
    assert all(torch.equal(a, b) for a, b in zip(plain["video_pixels"], timed["video_pixels"], strict=True))


def per_patch_grids(inputs):
    """The same inputs with every video grid (t, h, w) split into t grids (1, h, w)."""
    grids = [g for grid in inputs["video_grid_thw"] for g in [[1, *grid[1:].tolist()]] * int(grid[0])]
    seconds = inputs["second_per_grid_ts"].repeat_interleave(inputs["video_grid_thw"][:, 0])
    return {**inputs, "video_grid_thw": torch.tensor(grids), "second_per_grid_ts": seconds}


def test_positions_and_logits_equal_one_grid_per_patch(tiny_model_dir, rows):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    encoded = encode_rows(processor, rows, TEXT_TIME)
    inputs = generation_inputs(encoded, processor.tokenizer.pad_token_id, model.config.video_token_id)
    split = per_patch_grids(inputs)
    assert split["video_grid_thw"].shape[0] > inputs["video_grid_thw"].shape[0]

    def rope(batch):
        return model.model.get_rope_index(
            batch["input_ids"],
            batch["mm_token_type_ids"],
            video_grid_thw=batch["video_grid_thw"],
            second_per_grid_ts=batch["second_per_grid_ts"],
            attention_mask=batch["attention_mask"],
        )

    (positions, deltas), (expected, expected_deltas) = rope(inputs), rope(split)
    assert torch.equal(positions, expected) and torch.equal(deltas, expected_deltas)
    # the text after each one-patch block starts past the block's largest position
    with torch.no_grad():
        logits = model(**inputs).logits
        reference = model(**split).logits
    assert torch.allclose(logits, reference, atol=1e-5, rtol=1e-5)
    plain = generation_inputs(
        encode_rows(processor, rows, QWEN2_5_VL),
        processor.tokenizer.pad_token_id,
        model.config.video_token_id,
    )
    assert not torch.equal(rope(plain)[0][:, 0, -3:], positions[:, 0, -3:])  # the layout did change


def test_qwen3_families_refuse_the_option():
    for name in ("qwen3_vl", "qwen3_5"):
        with pytest.raises(ValueError, match="frame_timestamps_in_text: .* already writes"):
            FAMILIES[name].with_text_timestamps()
    assert QWEN2_5_VL.with_text_timestamps(False) is QWEN2_5_VL and not QWEN2_5_VL.text_timestamps


def test_training_with_text_timestamps(tiny_model_dir, train_file, tmp_path):
    data = build_dataset(train_file, sampling=sampling_for("qwen2_5_vl", max_frames=8))
    trainer = make_trainer(
        tiny_model_dir,
        data,
        tmp_path,
        beta=0.04,
        num_iterations=2,
        max_steps=2,
        trainer_kwargs={"frame_timestamps_in_text": True},
    )
    probe = ForwardProbe(trainer.model)
    trainer.train()
    assert_loss_positions_equal_generation(probe)
    prompt = trainer.processing_class.tokenizer.decode(
        next(c for c in probe.rope_calls if not c["grad"])["input_ids"][0]
    )
    assert re.search(r"<\d+\.\d seconds><\|vision_start\|><\|video_pad\|>", prompt)


def test_merger_trains_with_a_frozen_tower(tiny_model_dir, train_file, tmp_path):
    """TimeLens's --freeze_vision_tower True --freeze_merger False: only the merger of the vision module moves."""
    data = build_dataset(train_file, sampling=sampling_for("qwen2_5_vl", max_frames=8))
    trainer = make_trainer(
        tiny_model_dir,
        data,
        tmp_path,
        trainer_kwargs={"freeze_vision_tower": True, "train_vision_merger": True},
    )
    visual = trainer.model.model.visual
    before = {n: p.detach().clone() for n, p in visual.named_parameters()}
    assert {n.split(".")[0] for n, p in visual.named_parameters() if p.requires_grad} == {"merger"}
    trainer.train()
    moved = {n.split(".")[0] for n, p in visual.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"merger"}, moved


def test_merger_option_needs_a_frozen_tower():
    from video_grpo.configs import GRPOScriptArguments

    with pytest.raises(ValueError, match="train_vision_merger: only applies with freeze_vision_tower"):
        GRPOScriptArguments(train_vision_merger=True)


@pytest.mark.launch
def test_timelens_style_run_on_zero1(tiny_model_dir, tmp_path):
    """TimeLens's launch on the CPU twin of their ZeRO-1: answer-only prompt and IoU-only reward, textual
    timestamps, frozen vision tower, constant learning rate; it trains, saves and leaves the tower alone."""
    from video_grpo.configs import TIMELENS_PROMPT_TEXT_TIMESTAMPS

    from .test_launch import changed, launch, load

    out = tmp_path / "zero1"
    result = launch(
        "cpu/zero1.yaml",
        tiny_model_dir,
        out,
        "--reward_funcs",
        "iou_answer_only",
        "tests.launch_rewards:length_reward",
        "--prompt_template",
        TIMELENS_PROMPT_TEXT_TIMESTAMPS,
        "--frame_timestamps_in_text",
        "true",
        "--freeze_vision_tower",
        "true",
        "--lr_scheduler_type",
        "constant",
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert "distributed_type=DEEPSPEED num_processes=2 zero_stage=1" in log
    initial, trained = load(tiny_model_dir), load(out)
    assert changed(initial, trained, "language") and not changed(initial, trained, "vision")
