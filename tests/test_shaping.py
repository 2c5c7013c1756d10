"""TempSamp-R1 advantage shaping (grpo_math), the guided answer's text, and the two config fields."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.trainer.utils import nanstd

from video_grpo.explain import explain
from video_grpo.grpo import parse_args
from video_grpo.loss.grpo_math import group_advantages, shaped_advantages, tempsamp_shape
from video_grpo.rewards.functions import (
    DEFAULT_ANSWER_TEMPLATE,
    format_reward,
    iou_reward,
    parse_span,
    render_answer,
)

from .conftest import REPO

F64 = torch.float64


def test_eq4_by_hand():
    # tau = 0.8, alpha1 = 0.01, alpha2 = 1; e - 1 = 1.718282
    rewards = torch.tensor([0.0, 0.3, 0.55, 0.79, 0.8, 0.9, 1.0], dtype=F64)
    expected = [
        0.8 - (math.exp(0.8) - 1) / (math.e - 1),  # 0.8 - 1.225541/1.718282 = 0.086764
        0.8 - (math.exp(0.5) - 1) / (math.e - 1),  # 0.422460
        0.8 - (math.exp(0.25) - 1) / (math.e - 1),  # 0.634704
        0.8 - (math.exp(0.01) - 1) / (math.e - 1),  # 0.794151
        0.8,
        0.8 + 0.01 * math.log(1.1),  # 0.800953
        0.8 + 0.01 * math.log(1.2),  # 0.801823
    ]
    assert tempsamp_shape(rewards).tolist() == pytest.approx(expected, abs=1e-12)
    assert tempsamp_shape(rewards).tolist() == pytest.approx(
        [0.086764, 0.422460, 0.634704, 0.794151, 0.8, 0.800953, 0.801823], abs=1e-6
    )
    just_below = tempsamp_shape(torch.tensor([0.8 - 1e-9], dtype=F64)).item()
    assert just_below == pytest.approx(0.8, abs=1e-8)  # continuous at tau
    assert math.isnan(tempsamp_shape(torch.tensor([float("nan")])).item())


def test_guided_group_by_hand():
    rewards = torch.tensor([0.30, 0.50, 0.55, 1.00], dtype=F64)
    guided = torch.tensor([False, False, False, True])
    plain = shaped_advantages(rewards, 4, guided, method="none")
    # mean 0.5875; unbiased std sqrt(0.261875/3) = 0.295452
    assert plain.tolist() == pytest.approx([-0.9728, -0.2961, -0.1269, 1.3957], abs=1e-4)
    assert (plain[:3] < 0).all()  # the guided answer pushes every sampled answer down
    shaped = shaped_advantages(rewards, 4, guided, method="tempsamp")
    # shaped rewards [0.422460, 0.596390, 0.634704, 0.801823], mean 0.613844, unbiased std 0.155672
    assert shaped.tolist() == pytest.approx([-1.2286, -0.1120, 0.1339, 1.2067], abs=1e-4)
    assert shaped[2] > 0 and shaped[3] == shaped.max()
    assert "A = [-1.2286, -0.1120, +0.1339, +1.2067]" in explain()
    assert "A = [-0.9728, -0.2961, -0.1269, +1.3957]" in explain()


def _trl_advantages(rewards: torch.Tensor, group: int, scale: str) -> torch.Tensor:
    """TRL 1.16 GRPOTrainer's sum_then_normalize lines, restated with its own nanstd."""
    mean = torch.nanmean(rewards.view(-1, group), dim=1).repeat_interleave(group, dim=0)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, group), dim=1).repeat_interleave(group, dim=0)
    advantages = rewards - mean
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_none_is_trl(scale):
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=gen) * 2
    rewards[5] = float("nan")  # an unscorable answer: left out of its group's statistics, advantage 0
    ours = shaped_advantages(rewards, 8, method="none", scale=scale)
    assert torch.allclose(ours, _trl_advantages(rewards, 8, scale), atol=1e-6)
    assert ours[5] == 0
    clean = torch.rand(16, generator=gen)
    assert torch.allclose(shaped_advantages(clean, 4), group_advantages(clean, 4), atol=1e-7)


def test_tempsamp_is_none_on_shaped_rewards():
    rewards = torch.rand(16, generator=torch.Generator().manual_seed(1), dtype=F64)
    guided = torch.zeros(16, dtype=torch.bool)
    guided[3::4] = True
    assert torch.allclose(
        shaped_advantages(rewards, 4, guided, "tempsamp"),
        shaped_advantages(tempsamp_shape(rewards), 4, guided, "none"),
    )


@st.composite
def guided_groups(draw, best_sampled_at_least: float = 0.0):
    """G-1 sampled IoUs and a guided IoU at least as high as each (the guided answer wins)."""
    size = draw(st.integers(2, 8))
    sampled = draw(st.lists(st.floats(0, 1), min_size=size - 1, max_size=size - 1))
    best = max(sampled)
    if best < best_sampled_at_least:
        sampled[sampled.index(best)] = best = draw(st.floats(best_sampled_at_least, 1))
    guided = draw(st.floats(best, 1))
    return sampled, guided


def _sampled_advantages(sampled, guided, method):
    rewards = torch.tensor([*sampled, guided], dtype=F64)
    mask = torch.zeros(len(rewards), dtype=torch.bool)
    mask[-1] = True
    return shaped_advantages(rewards, len(rewards), mask, method=method, scale="none")[:-1]


@settings(max_examples=500, deadline=None)
@given(guided_groups())
def test_shaping_never_makes_all_sampled_answers_negative_where_grpo_did_not(group):
    # Eq. 4 is increasing and concave, so it narrows the guided answer's lead over the best sampled answer at least
    # as much as the spread below it: a group in which plain GRPO keeps a sampled answer >= 0 keeps one.
    sampled, guided = group
    if _sampled_advantages(sampled, guided, "none").max() >= 0:
        assert _sampled_advantages(sampled, guided, "tempsamp").max() >= -1e-12


@settings(max_examples=500, deadline=None)
@given(guided_groups(best_sampled_at_least=0.8), st.floats(0, 0.79))
def test_with_shaping_a_good_sampled_answer_is_not_pushed_down_by_the_guided_one(group, low):
    # The guided answer (IoU up to 1) wins; the best sampled answer reaches tau = 0.8 and another one is at least
    # 0.01 below tau. After shaping, not every sampled answer is negative.
    sampled, guided = group
    sampled = [*sampled, low]
    assert _sampled_advantages(sampled, guided, "tempsamp").max() >= 0


def test_without_shaping_a_good_group_can_be_all_negative():
    # The same kind of group as above, where plain GRPO pushes every sampled answer down.
    sampled, guided = [0.8, 0.8, 0.79], 1.0
    assert (_sampled_advantages(sampled, guided, "none") < 0).all()
    assert _sampled_advantages(sampled, guided, "tempsamp").max() > 0


def test_equal_sampled_answers_below_the_guided_one_stay_negative():
    # What shaping cannot do (any increasing reshaping): equal sampled rewards lie below the group mean.
    assert (_sampled_advantages([0.5, 0.5, 0.5], 1.0, "tempsamp") < 0).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "tempsmp"}, "method must be one of"),
        ({"scale": "groups"}, "scale must be"),
        ({"group_size": 3}, "group_size 3 does not divide"),
        (
            {"guided_mask": torch.tensor([True, True, False, False, False, False, False, False])},
            "group 0 has 2 guided",
        ),
        ({"guided_mask": torch.zeros(8)}, "guided_mask must be a bool tensor"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"rewards": torch.rand(8), "group_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        shaped_advantages(**args)


def test_guided_answer_text_scores_as_the_annotation():
    answer = render_answer(DEFAULT_ANSWER_TEMPLATE, 24.35, 30.4, "person turns on the light", decimals=2)
    assert (
        answer
        == "<think>The event is visible from 24.35 to 30.40 seconds.</think><answer>24.35 to 30.40</answer>"
    )
    assert parse_span(answer) == (24.35, 30.4)
    assert format_reward([answer]) == [1.0]
    assert iou_reward([answer], solution=[[24.35, 30.4]], duration=[31.0]) == [1.0]
    # SFT's target keeps one decimal
    assert render_answer(DEFAULT_ANSWER_TEMPLATE, 24.35, 30.4).endswith("<answer>24.4 to 30.4</answer>")


def _recipe(tmp_path, **values):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump(
            {"train_file": "a.jsonl", "output_dir": str(tmp_path), "use_cpu": True, "bf16": False, **values}
        )
    )
    return ["--config", str(path)]


def test_config_fields(tmp_path, caplog):
    script, _, _ = parse_args(_recipe(tmp_path))
    assert script.gt_guidance is False and script.advantage_shaping == "none"
    script, _, _ = parse_args(_recipe(tmp_path, gt_guidance=True, advantage_shaping="tempsamp"))
    assert script.gt_guidance is True and script.advantage_shaping == "tempsamp"
    script, _, _ = parse_args(
        [*_recipe(tmp_path), "--advantage_shaping", "tempsamp"]
    )  # shaping alone is allowed
    assert script.advantage_shaping == "tempsamp" and not script.gt_guidance
    with pytest.raises(ValueError, match=r"GRPOScriptArguments.advantage_shaping: unknown shaping 'temp'"):
        parse_args(_recipe(tmp_path, advantage_shaping="temp"))
    with caplog.at_level("WARNING"):
        parse_args(_recipe(tmp_path, gt_guidance=True))
    assert "set advantage_shaping: tempsamp" in caplog.text


def test_docs_show_the_real_explain_output():
    internals = (REPO / "docs" / "internals.md").read_text()
    intro = internals.index("`python -m video_grpo.explain` prints worked examples; this is its output:")
    start = internals.index("```\n", intro) + 4
    assert internals[start : internals.index("\n```", start)] == explain()
