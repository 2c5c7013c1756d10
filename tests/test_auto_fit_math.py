"""The changes auto-fit applies keep the mathematics of a step (``video_grpo.plan.autofit``), and its rule for the
micro-batch (``video_grpo.plan.loss_split.micro_batch_refusal``) agrees with what TRL's own loss does.

Each case trains the tiny model twice from the same weights on the same sampled answers, fp32 (``bf16=False``),
through TRL's and our real trainer (generation batch, micro-batching, accumulation, ``_compute_loss``, backward),
and compares the loss and the gradients at every optimizer step. Only the *sampling* is fixed: each run's
generation returns the same seeded answers of varied lengths (:func:`fixed_sampling`), so both runs score the same
rows.

- micro-batch 2 x accumulation 1 x ``steps_per_generation`` 2 against 1 x 2 x 4 (the generation batch of 4 rows and
  the optimizer batch of 2 kept, as auto-fit's change keeps them; ``steps_per_generation`` != accumulation, so one
  generation feeds two optimizer steps), ``num_iterations`` 2 (the third step reuses the answers with ratio != 1),
  for every loss TRL 1.16 accepts, with rewards scaled (and beta 0.04: the reference pass) and unscaled, and with
  the entropy bonus on; then the adaptive entropy bonus and ``top_entropy_quantile`` < 1. Where
  ``micro_batch_refusal`` offers the change, the gradients agree to fp32 noise; where it refuses, they differ by
  far more, so each case checks the rule against the measurement both ways;
- gradient checkpointing on and off: equal gradients.
"""

from __future__ import annotations

import gc
import re

import pytest
import torch
from transformers import AutoProcessor, TrainerCallback
from trl import GRPOConfig

from video_grpo.data.dataset import build_dataset
from video_grpo.data.video import SamplingConfig
from video_grpo.plan.loss_split import TRL_LOSSES, LossSettings, micro_batch_refusal
from video_grpo.trainer import VideoGRPOTrainer

from .launch_rewards import length_reward  # differs within a group: nonzero advantages, real gradients

SAMPLING = SamplingConfig(
    fps=1.0, min_frames=2, max_frames=2, min_pixels=784, max_pixels=56 * 56, max_tokens=64
)
G = 4  # one prompt's group per generation batch: the micro-batches split it
# relative to the largest gradient: fp32 rounding (measured over the cases: at most 5.8e-6, sapo)
NOISE = 5e-5
CHANGED = 10 * NOISE  # a refused case must differ by more (measured: at least 3.4e-3, the adaptive bonus)


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
    """``train(micro, accumulation, steps_per_generation, **settings)``: a short fp32 run's (gradients per optimizer step, logged
    losses, rows per generation call), each setting run once per module (cases share their reference run)."""
    runs: dict = {}
    # each run's end (accelerate's free_memory) collects garbage over every object alive: freezing what exists
    # now (the imported libraries) halves a run's time
    gc.collect()
    gc.freeze()

    def run(micro: int, accumulation: int, generation_steps: int, **settings):
        key = (micro, accumulation, generation_steps, tuple(sorted(settings.items())))
        if key not in runs:
            out = tmp_path_factory.mktemp("run")
            runs[key] = train_once(
                tiny_model_dir, dataset, out, micro, accumulation, generation_steps, **settings
            )
        return runs[key]

    yield run
    gc.unfreeze()


def train_once(
    model_dir, dataset, out, micro: int, accumulation: int, generation_steps: int, **settings
) -> tuple[list, list, list]:
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=generation_steps,
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


def trl_losses() -> set[str]:
    """The loss types TRL's installed GRPOConfig documents as supported."""
    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    supported = re.search(r"Supported values are (.*?)\. ", help_text)
    assert supported, help_text[:200]
    return set(re.findall(r"'(\w+)'", supported.group(1)))


def cases() -> dict[str, dict]:
    """Every loss with rewards scaled (and the reference pass) and unscaled; the entropy bonus on with each family
    of normaliser that keeps the step (a row's mean: grpo; the generation batch's tokens: dapo), adaptive (from
    entropy_coef 0: on all the same) and with a top-entropy quantile. The bonus's coefficient is 1, not a recipe's
    0.01: the tiny random model's near-uniform answers give the entropy a small gradient (at 0.01 the first step
    changes by 3.1e-5 of the largest gradient, under NOISE), and at 1 the first step's change (3.1e-3, measured)
    stands far above fp32 rounding (at most 5.8e-6)."""
    out = {}
    for loss in TRL_LOSSES:
        # luspo's paper setup is sequence-level, and TRL only warns at its default, token: one case each
        level = "sequence" if loss == "luspo" else "token"
        out[f"{loss}-scaled"] = {
            "loss_type": loss,
            "importance_sampling_level": level,
            "scale_rewards": "group",
            "beta": 0.04,
        }
        out[f"{loss}-unscaled"] = {"loss_type": loss, "scale_rewards": "none", "beta": 0.0}
    for loss in ("grpo", "dapo"):
        out[f"{loss}-entropy"] = {
            "loss_type": loss,
            "scale_rewards": "group",
            "beta": 0.0,
            "entropy_coef": 1.0,
        }
    # the adaptive coefficient applies from the second step: the first has no entropy measured yet
    adaptive = {
        "use_adaptive_entropy": True,
        "entropy_coef": 0.0,
        "entropy_coef_delta": 1.0,
        "entropy_target": 1e3,
    }
    out["grpo-adaptive-entropy"] = {"loss_type": "grpo", "scale_rewards": "group", "beta": 0.0, **adaptive}
    out["dapo-top-entropy"] = {
        "loss_type": "dapo",
        "scale_rewards": "group",
        "beta": 0.0,
        "top_entropy_quantile": 0.5,
    }
    return out


CASES = cases()


def test_the_rule_knows_every_loss_trl_has():
    assert set(TRL_LOSSES) == trl_losses()
    assert {case.rsplit("-", 1)[0] for case in CASES if case.endswith("-scaled")} == trl_losses()
    refused = {case for case, settings in CASES.items() if micro_batch_refusal(LossSettings.of(settings))}
    assert refused == {
        "bnpo-scaled",
        "bnpo-unscaled",
        "grpo-entropy",
        "dapo-entropy",
        "grpo-adaptive-entropy",
        "dapo-top-entropy",
    }


@pytest.mark.parametrize("case", list(CASES))
def test_a_smaller_micro_batch_keeps_the_step_exactly_where_auto_fit_offers_it(train, case):
    """Micro-batch 2 x accumulation 1 x steps_per_generation 2 against 1 x 2 x 4, num_iterations 2, three optimizer
    steps (two on fresh answers, one reusing them): equal to fp32 noise where the rule offers a smaller
    micro-batch, measurably different where it refuses one."""
    settings = {**CASES[case], "num_iterations": 2, "max_steps": 3}
    whole, whole_loss, whole_calls = train(2, 1, 2, **settings)
    halved, halved_loss, halved_calls = train(1, 2, 4, **settings)
    assert whole_calls == halved_calls == [4], "the generation batch must not shrink with the micro-batch"
    assert len(whole) == 3
    difference = largest_difference(whole, halved)
    refusal = micro_batch_refusal(LossSettings.of(CASES[case]))
    if refusal is None:
        assert difference < NOISE, (case, difference)
        assert halved_loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-7)
    else:
        assert difference > CHANGED, (case, difference, refusal)


def test_gradient_checkpointing_gives_the_same_gradients(train):
    settings = {"loss_type": "grpo", "beta": 0.04, "num_iterations": 2, "max_steps": 2}
    plain, plain_loss, _ = train(4, 1, 1, **settings)
    checkpointed, loss, _ = train(4, 1, 1, gradient_checkpointing=True, **settings)
    assert largest_difference(plain, checkpointed) < NOISE
    assert loss == pytest.approx(plain_loss, rel=1e-5, abs=1e-7)


def test_timelens2_bnpo_on_one_answer_per_micro_batch_is_grpo_over_the_group(train):
    """TimeLens2's launch puts one answer per micro-batch (BATCH_PER_DEVICE 1, accumulation 8) under their bnpo
    loss: each answer's token mean, averaged over the group. That layout (micro-batch 1, accumulation G,
    ``steps_per_generation`` G: one generation of the group) gives TRL's grpo loss over the group's answers in one
    micro-batch exactly, which is how the TimeLens2 presets train (one prompt's answers per GPU: its prompt run
    once); bnpo over the whole group in one micro-batch (a token mean across answers) is another loss."""
    settings = {"scale_rewards": "none", "beta": 0.04, "max_steps": 2}
    theirs, theirs_loss, theirs_calls = train(1, G, G, loss_type="bnpo", **settings)
    grpo, grpo_loss, grpo_calls = train(G, 1, 1, loss_type="grpo", **settings)
    together, _, _ = train(G, 1, 1, loss_type="bnpo", **settings)
    assert theirs_calls == grpo_calls == [G, G]  # one generation of the group per optimizer step
    assert largest_difference(theirs, grpo) < NOISE
    assert theirs_loss == pytest.approx(grpo_loss, rel=1e-5, abs=1e-7)
    assert largest_difference(together, grpo) > CHANGED
