"""VideoGRPOTrainer on the tiny model: video in every forward, time from the sampled fps, batching, options.

Each test runs real GRPO steps in-process (generation, rewards, loss, optimizer) and inspects the model's
forward calls through hooks; nothing in the trainer is mocked.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoProcessor
from trl import GRPOConfig, GRPOTrainer

from video_grpo.data.dataset import VideoTransform, build_dataset
from video_grpo.data.video import SamplingConfig, sampled_fps
from video_grpo.rewards.functions import iou_reward
from video_grpo.trainer import VideoGRPOTrainer

from .launch_rewards import length_reward  # differs within a group: nonzero advantages, real gradients

SAMPLING = SamplingConfig(
    fps=1.0, min_frames=2, max_frames=8, min_pixels=784, max_pixels=56 * 56, max_tokens=64
)


def make_trainer(
    model_dir,
    dataset,
    tmp_path,
    trainer_cls=VideoGRPOTrainer,
    reward_funcs=None,
    eval_dataset=None,
    trainer_kwargs=None,
    **overrides,
):
    settings = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 8,
        "max_steps": 1,
        "learning_rate": 1e-2,
        "bf16": False,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "loss_type": "grpo",
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    settings.update(overrides)
    return trainer_cls(
        model=str(model_dir),
        reward_funcs=reward_funcs or [length_reward, iou_reward],
        args=GRPOConfig(**settings),
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        processing_class=AutoProcessor.from_pretrained(model_dir),
        **(trainer_kwargs or {}),
    )


class ForwardProbe:
    """Records, for every model forward, whether it ran with grad (only the loss forward does) and its video
    kwargs; counts vision-encoder calls with grad; records each 3-D position computation."""

    def __init__(self, model) -> None:
        self.forwards: list[dict] = []
        self.encoder_calls_with_grad = 0
        self.rope_calls: list[dict] = []
        model.register_forward_pre_hook(self._on_forward, with_kwargs=True)
        model.model.visual.register_forward_hook(self._on_encoder)
        inner = model.model
        original = inner.get_rope_index

        def spy(input_ids, *args, **kwargs):
            out = original(input_ids, *args, **kwargs)
            self.rope_calls.append(
                {
                    "grad": torch.is_grad_enabled(),
                    "input_ids": input_ids.clone(),
                    "attention_mask": kwargs.get("attention_mask"),
                    "positions": out[0].clone(),
                }
            )
            return out

        inner.get_rope_index = spy

    def _on_forward(self, module, args, kwargs):
        self.forwards.append(
            {
                "grad": torch.is_grad_enabled(),
                **{
                    k: kwargs.get(k)
                    for k in (
                        "input_ids",
                        "pixel_values_videos",
                        "video_grid_thw",
                        "second_per_grid_ts",
                        "mm_token_type_ids",
                        "position_ids",
                    )
                },
                # generate() runs the encoder up front and passes its output instead of pixels
                "sees_video": kwargs.get("pixel_values_videos") is not None
                or (kwargs.get("mm_encoder_outputs") or {}).get("video") is not None,
            }
        )

    def _on_encoder(self, module, args, output):
        self.encoder_calls_with_grad += int(torch.is_grad_enabled())

    @property
    def loss_forwards(self) -> list[dict]:
        return [f for f in self.forwards if f["grad"]]


def vision_snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.model.visual.named_parameters()}


def changed(before: dict, model) -> bool:
    return any(not torch.equal(before[n], p.detach()) for n, p in model.model.visual.named_parameters())


@pytest.fixture(scope="module")
def dataset(train_file):
    return build_dataset(train_file, sampling=SAMPLING)


class FramesInPromptTransform(VideoTransform):
    """What plain TRL users do: put the frames in the prompt so the processor sees them at generation."""

    def __call__(self, batch):
        batch = super().__call__(batch)
        for prompt, frames in zip(batch["prompt"], batch["video_frames"], strict=True):
            prompt[0]["content"][0] = {"type": "video", "video": frames}
        return batch


def test_video_reaches_the_loss(tiny_model_dir, dataset, tmp_path):
    trainer = make_trainer(tiny_model_dir, dataset, tmp_path)
    probe = ForwardProbe(trainer.model)
    before = vision_snapshot(trainer.model)
    trainer.train()
    assert probe.encoder_calls_with_grad >= 1, "the vision encoder did not run in the loss forward"
    assert all(f["pixel_values_videos"] is not None for f in probe.loss_forwards)
    assert changed(before, trainer.model), "vision tower weights did not change: no gradient reached it"


def test_plain_grpo_trainer_drops_video_from_the_loss(tiny_model_dir, train_file, tmp_path):
    """The check above, run against TRL's own GRPOTrainer, fails: this is the bug VideoGRPOTrainer fixes."""
    plain_dataset = build_dataset(train_file, sampling=SAMPLING)
    plain_dataset.set_transform(FramesInPromptTransform(SAMPLING))
    trainer = make_trainer(tiny_model_dir, plain_dataset, tmp_path, trainer_cls=GRPOTrainer)
    probe = ForwardProbe(trainer.model)
    before = vision_snapshot(trainer.model)
    trainer.train()
    generation = [f for f in probe.forwards if not f["grad"] and f["sees_video"]]
    assert generation, "plain TRL should still show the video to generation"
    assert probe.encoder_calls_with_grad == 0
    assert not changed(before, trainer.model)


@pytest.mark.parametrize("fps", [1.0, 0.5])
def test_time_comes_from_sampled_fps_and_positions_match_generation(
    tiny_model_dir, train_file, tmp_path, fps
):
    sampling = SamplingConfig(
        fps=fps, min_frames=2, max_frames=64, min_pixels=784, max_pixels=28 * 56, max_tokens=512
    )
    data = build_dataset(train_file, sampling=sampling)
    trainer = make_trainer(tiny_model_dir, data, tmp_path)
    seen_inputs = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        seen_inputs.extend(inputs)
        return original(inputs)

    trainer._generate_and_score_completions = spy
    probe = ForwardProbe(trainer.model)
    trainer.train()

    expected = sorted({2 / sampled_fps(x["video_metadata"]) for x in seen_inputs})
    # shared_prefix (the default) packs a micro-batch's rows by prompt: one value per prompt, not per row
    got = sorted({t for f in probe.loss_forwards for t in f["second_per_grid_ts"].tolist()})
    assert got == pytest.approx(expected, rel=1e-5)
    assert all(f["position_ids"] is not None for f in probe.loss_forwards)
    assert got == pytest.approx([2 / fps] * len(got), rel=0.1)  # not the processor's 24-fps default
    for f in probe.loss_forwards:
        assert torch.equal(f["mm_token_type_ids"] == 2, f["input_ids"] == trainer.video_token_id)

    assert_loss_positions_equal_generation(probe)


def assert_loss_positions_equal_generation(probe: ForwardProbe) -> None:
    """Each loss-forward row starts with a prompt generation saw, token for token, and gives it the 3-D positions
    generation gave it."""
    prefill = next(c for c in probe.rope_calls if not c["grad"])
    loss_calls = [c for c in probe.rope_calls if c["grad"]]
    assert loss_calls
    gen_rows = {}
    for row in range(prefill["input_ids"].shape[0]):
        keep = prefill["attention_mask"][row].bool()
        gen_rows[tuple(prefill["input_ids"][row][keep].tolist())] = prefill["positions"][:, row, keep]
    for call in loss_calls:
        for row in range(call["input_ids"].shape[0]):
            ids = call["input_ids"][row][call["attention_mask"][row].bool()].tolist()
            prompt = next(p for p in gen_rows if tuple(ids[: len(p)]) == p)  # identical prompt tokens
            positions = call["positions"][:, row, call["attention_mask"][row].bool()][:, : len(prompt)]
            assert torch.equal(positions, gen_rows[prompt])
            assert (
                positions[0].max() > positions[1].max() or positions[0].unique().numel() > 1
            )  # real time axis
    # Packed rows (shared_prefix): the positions the forward was given start with a prompt's, token for token
    packed = [f for f in probe.loss_forwards if f["position_ids"] is not None]
    for forward in packed:
        for row in range(forward["input_ids"].shape[0]):
            ids = forward["input_ids"][row].tolist()
            prompt = next(p for p in gen_rows if tuple(ids[: len(p)]) == p)
            assert torch.equal(forward["position_ids"][:, row, : len(prompt)], gen_rows[prompt])


def test_batch_of_videos_with_different_lengths(tiny_model_dir, train_file, tmp_path):
    sampling = SamplingConfig(
        fps=0.5, min_frames=2, max_frames=64, min_pixels=784, max_pixels=28 * 56, max_tokens=512
    )
    data = build_dataset(train_file, sampling=sampling)
    durations = list(data.with_format(None)["duration"])
    short, long = durations.index(min(durations)), durations.index(max(durations))
    data = data.select([short, long])
    trainer = make_trainer(tiny_model_dir, data, tmp_path, per_device_train_batch_size=4, num_generations=2)
    probe = ForwardProbe(trainer.model)
    trainer.train()
    frames_per_row = {int(t) for f in probe.loss_forwards for t in f["video_grid_thw"][:, 0]}
    assert len(frames_per_row) == 2, (
        f"expected two different video lengths in one batch, got {frames_per_row}"
    )
    # 4 rows = 2 prompts x 2 answers; shared_prefix packs them into one row per prompt
    assert all(f["input_ids"].shape[0] == 2 for f in probe.loss_forwards)


@pytest.mark.parametrize(
    "options",
    [
        {"beta": 0.04},
        {"num_iterations": 2, "max_steps": 2},
        {"steps_per_generation": 2, "max_steps": 2},
        {"log_completions": True},
    ],
    ids=["beta", "num_iterations", "steps_per_generation", "log_completions"],
)
def test_training_options(tiny_model_dir, dataset, tmp_path, options):
    trainer = make_trainer(tiny_model_dir, dataset, tmp_path, **options)
    probe = ForwardProbe(trainer.model)
    before = vision_snapshot(trainer.model)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs and all(math.isfinite(float(entry["loss"])) for entry in logs)
    assert changed(before, trainer.model)
    assert all(
        f["sees_video"]
        for f in probe.forwards
        if f["input_ids"] is not None and (f["input_ids"] == trainer.video_token_id).any()
    )
    if options.get("beta"):
        assert any("kl" in entry for entry in logs)


def test_vision_placeholders_cannot_be_sampled(tiny_model_dir, dataset, tmp_path):
    trainer = make_trainer(tiny_model_dir, dataset, tmp_path)
    config = trainer.model.config
    for token_id in (config.video_token_id, config.image_token_id):
        assert token_id in trainer.generation_config.suppress_tokens
