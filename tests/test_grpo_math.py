"""The GRPO math module: hand-checked numbers, properties, and equality with the trainer's loss."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from video_grpo.data.dataset import build_dataset
from video_grpo.explain import explain
from video_grpo.loss.grpo_math import (
    aggregate,
    clip_ratio,
    clipped_surrogate,
    group_advantages,
    grpo_loss,
    k3_kl,
)

from .test_trainer import SAMPLING, make_trainer


def test_advantages_both_conventions():
    rewards = torch.tensor([0.0, 1.6, 5.4, 8.8])
    assert group_advantages(rewards, 4).tolist() == pytest.approx(
        [-1.0006, -0.5953, 0.3673, 1.2286], abs=1e-4
    )
    assert group_advantages(rewards, 4, std="population").tolist() == pytest.approx(
        [-1.1554, -0.6874, 0.4241, 1.4186], abs=1e-4
    )
    assert group_advantages(torch.tensor([0.6, 0.9, 0.1, 0.4]), 4, scale=False).tolist() == pytest.approx(
        [0.1, 0.4, -0.4, -0.1], abs=1e-6
    )


def test_worked_example_a():
    ratios = torch.tensor([1.3, 1.1, 0.8, 1.2])
    adv = torch.tensor([0.1, 0.4, -0.4, -0.1])
    surrogate = clipped_surrogate(ratios, adv, 0.2)
    assert surrogate.tolist() == pytest.approx([0.12, 0.44, -0.32, -0.12], abs=1e-6)  # output 1: 1.2 x 0.1
    kl = k3_kl(torch.log(ratios), torch.zeros(4))
    objective = (surrogate - 0.01 * kl).mean()
    assert objective.item() == pytest.approx(0.0298, abs=5e-5)
    text = explain()
    assert "clip(rho)*A = 1.20*+0.10 = +0.1200" in text and "batch objective = mean = +0.0298" in text
    assert "[-1.0006, -0.5953, +0.3673, +1.2286]" in text


def test_clip_table():
    ratios = torch.tensor([0.85, 0.90, 1.15, 1.25])
    assert clip_ratio(ratios, 0.2).tolist() == pytest.approx([0.85, 0.90, 1.15, 1.2])
    assert clipped_surrogate(ratios, torch.ones(4), 0.2).tolist() == pytest.approx([0.85, 0.90, 1.15, 1.2])
    assert clipped_surrogate(ratios, -torch.ones(4), 0.2).tolist() == pytest.approx(
        [-0.85, -0.90, -1.15, -1.25]
    )
    assert clip_ratio(torch.tensor([1.3]), 0.2, 0.28).item() == pytest.approx(1.28)


@settings(max_examples=2000, deadline=None)
@given(st.floats(-20, 20), st.floats(-20, 20))
def test_k3_never_negative(logp, ref_logp):
    assert (
        k3_kl(
            torch.tensor(0.0, dtype=torch.float64), torch.tensor(3.650795073826495e-09, dtype=torch.float64)
        )
        >= 0
    )
    assert (
        k3_kl(torch.tensor(logp, dtype=torch.float64), torch.tensor(ref_logp, dtype=torch.float64)).item()
        >= 0
    )


@settings(deadline=None, max_examples=50)
@given(st.lists(st.floats(-5, 5), min_size=8, max_size=8))
def test_group_advantages_are_centred(values):
    adv = group_advantages(torch.tensor(values, dtype=torch.float64), 4).view(2, 4)
    assert adv.sum(dim=1).abs().max().item() < 1e-6


def test_aggregation_levels_differ_with_ragged_masks():
    per_token = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert aggregate(per_token, mask, "sequence").item() == pytest.approx(2.0)  # (1 + 3) / 2
    assert aggregate(per_token, mask, "token").item() == pytest.approx(7 / 5)


@pytest.mark.parametrize(("beta", "kl_correction"), [(0.0, True), (0.04, True), (0.04, False)])
def test_module_loss_equals_trainer_loss(tiny_model_dir, train_file, tmp_path, beta, kl_correction):
    trainer = make_trainer(
        tiny_model_dir,
        build_dataset(train_file, sampling=SAMPLING),
        tmp_path,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="grpo",
        use_bias_correction_kl=kl_correction,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    gen = torch.Generator().manual_seed(0)
    batch, length = 4, 6
    logps = -torch.rand(batch, length, generator=gen) * 3
    old = logps + (torch.rand(batch, length, generator=gen) - 0.5) * 0.8  # ratios well outside [0.8, 1.28]
    ref = logps + (torch.rand(batch, length, generator=gen) - 0.5)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    advantages = group_advantages(torch.tensor([0.0, 1.6, 5.4, 8.8]), 4)
    inputs = {
        "prompt_ids": torch.ones(batch, 3, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 3, dtype=torch.long),
        "completion_ids": torch.ones(batch, length, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
        "video_pixels": [None] * batch,
        "video_grid_thw": torch.zeros(batch, 3),
        "second_per_grid_ts": torch.zeros(batch),
    }
    # Same per-token log-probs for both: the model forward is replaced, the loss math is the trainer's own.
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (
        logps,
        torch.zeros_like(logps),
        None,
    )
    trainer_loss = trainer._compute_loss(trainer.model, inputs)
    module_loss = grpo_loss(
        logps,
        old,
        advantages,
        mask.float(),
        epsilon_low=0.2,
        epsilon_high=0.28,
        beta=beta,
        ref_per_token_logps=ref,
        kl_ratio_correction=kl_correction,
    )
    assert trainer_loss.item() == pytest.approx(module_loss.item(), rel=1e-6, abs=1e-7)
    assert (torch.exp(logps - old) > 1.28).any() and (
        torch.exp(logps - old) < 0.8
    ).any()  # clipping exercised
