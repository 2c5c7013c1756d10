"""The changes auto-fit applies keep the mathematics of a step (``video_grpo.plan.autofit``).

Each case trains the tiny model twice from the same weights on the same sampled answers, fp32 (``bf16=False``),
through TRL's and our real trainer (generation batch, micro-batching, accumulation, loss, backward), and compares
the loss and the gradients at every optimizer step. Only the *sampling* is fixed: each run's generation returns the
same seeded answers of varied lengths (:func:`fixed_sampling`), so both runs score the same rows.

- micro-batch B x accumulation A against B/2 x 2A with twice ``steps_per_generation`` (the generation batch kept),
  for each loss the recipes use (grpo; dapo, TRL's default), with beta 0 and one iteration and with beta 0.04 and
  two (both values of each; the second has the reference and old-policy passes): equal to fp32 noise. bnpo normalises each micro-batch by its own token count: its gradients differ, which is why auto-fit does
  not change bnpo's micro-batch (and why this comparison can fail);
- gradient checkpointing on and off: equal gradients.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor, TrainerCallback
from trl import GRPOConfig

from video_grpo.data import build_dataset
from video_grpo.plan.autofit import MICRO_BATCH_EXACT_LOSSES
from video_grpo.trainer import VideoGRPOTrainer
from video_grpo.video import SamplingConfig

from .launch_rewards import length_reward  # differs within a group: nonzero advantages, real gradients

SAMPLING = SamplingConfig(
    fps=1.0, min_frames=2, max_frames=8, min_pixels=784, max_pixels=56 * 56, max_tokens=64
)
G = 4  # one prompt's group per generation batch: the half micro-batch splits it, as G = 8 over 4 rows would
NOISE = 5e-5  # relative to the largest gradient: fp32 rounding (measured: at most 6.1e-7; bnpo 5.2e-2)


@pytest.fixture(scope="module")
def dataset(train_file):
    return build_dataset(train_file, sampling=SAMPLING)


class Gradients(TrainerCallback):
    """Every parameter's accumulated gradient just before each optimizer step."""

    def __init__(self, trainer) -> None:
        self.trainer, self.steps = trainer, []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        model = self.trainer.model
        self.steps.append(
            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        )


LENGTHS = (2, 6, 3, 4)  # answer tokens before the end of sequence: the two halves of a group differ (8 and 7)


def fixed_sampling(trainer, calls: list[int]):
    """A stand-in for sampling only: each generation batch gets the same seeded answers (of :data:`LENGTHS`, then
    end of sequence) in both runs. Everything after it (rewards, advantages, old/reference log-probs, the loss) is
    the trainer's."""
    generator = torch.Generator().manual_seed(0)
    eos = trainer.eos_token_ids[0]

    def sample(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        calls.append(len(prompt_ids))
        lengths = [LENGTHS[row % len(LENGTHS)] for row in range(len(prompt_ids))]
        return [torch.randint(10, 200, (n,), generator=generator).tolist() + [eos] for n in lengths], None

    return sample


@pytest.fixture(scope="module")
def train(tiny_model_dir, dataset, tmp_path_factory):
    """``train(micro, accumulation, **settings)``: a short fp32 run's (gradients per optimizer step, logged
    losses, rows per generation call), each setting run once per module (cases share their reference run)."""
    runs: dict = {}

    def run(micro: int, accumulation: int, **settings):
        key = (micro, accumulation, tuple(sorted(settings.items())))
        if key not in runs:
            out = tmp_path_factory.mktemp("run")
            runs[key] = train_once(tiny_model_dir, dataset, out, micro, accumulation, **settings)
        return runs[key]

    return run


def train_once(model_dir, dataset, out, micro: int, accumulation: int, **settings) -> tuple[list, list, list]:
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,  # one generation batch of 4 rows in both runs
        num_generations=G,
        max_completion_length=8,
        learning_rate=1e-2,
        max_grad_norm=0.0,  # the raw accumulated gradients are compared
        bf16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
        dataloader_num_workers=0,
        **{"gradient_checkpointing": False, **settings},
    )
    trainer = VideoGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=dataset,
        processing_class=AutoProcessor.from_pretrained(model_dir),
    )
    calls: list[int] = []
    trainer._generate_single_turn = fixed_sampling(trainer, calls)
    grads = Gradients(trainer)
    trainer.add_callback(grads)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return grads.steps, losses, calls


def largest_difference(a: list[dict], b: list[dict]) -> float:
    """The largest gradient difference over all steps, relative to the largest gradient."""
    assert len(a) == len(b) and a
    scale = max(g.abs().max().item() for step in a for g in step.values())
    assert scale > 1e-4, "no gradient: the comparison would prove nothing"
    return max((x[n] - y[n]).abs().max().item() for x, y in zip(a, b, strict=True) for n in x) / scale


@pytest.mark.parametrize("loss_type", MICRO_BATCH_EXACT_LOSSES)
@pytest.mark.parametrize(("beta", "num_iterations"), [(0.0, 1), (0.04, 2)], ids=["beta0-once", "beta-twice"])
def test_half_the_micro_batch_twice_the_accumulation_is_the_same_step(train, loss_type, beta, num_iterations):
    """Both values of beta and of num_iterations: the second case has the reference pass and the old-policy pass
    (computed at generation in micro-batch chunks), and a second step on the same answers with ratio != 1."""
    settings = {"loss_type": loss_type, "beta": beta, "num_iterations": num_iterations}
    settings["max_steps"] = num_iterations  # with 2 iterations the second step reuses the batch
    whole, whole_loss, whole_calls = train(4, 1, **settings)
    halved, halved_loss, halved_calls = train(2, 2, **settings)
    assert whole_calls == halved_calls == [4], "the generation batch must not shrink with the micro-batch"
    assert largest_difference(whole, halved) < NOISE
    assert halved_loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-7)


def test_bnpo_weighs_each_micro_batch_by_its_own_tokens(train):
    """bnpo divides each micro-batch's summed token loss by that micro-batch's token count: with answers of
    different lengths, another split is another step. auto-fit leaves its micro-batch alone."""
    assert "bnpo" not in MICRO_BATCH_EXACT_LOSSES
    whole, _, _ = train(4, 1, loss_type="bnpo", beta=0.0, num_iterations=1, max_steps=1)
    halved, _, _ = train(2, 2, loss_type="bnpo", beta=0.0, num_iterations=1, max_steps=1)
    assert largest_difference(whole, halved) > 100 * NOISE


def test_gradient_checkpointing_gives_the_same_gradients(train):
    settings = {"loss_type": "grpo", "beta": 0.04, "num_iterations": 2, "max_steps": 2}
    plain, plain_loss, _ = train(4, 1, **settings)
    checkpointed, loss, _ = train(4, 1, gradient_checkpointing=True, **settings)
    assert largest_difference(plain, checkpointed) < NOISE
    assert loss == pytest.approx(plain_loss, rel=1e-5, abs=1e-7)
