"""TimeLens2's draw weights (``video_grpo.data.sample_weights``): the rule, the sampler, off = TRL, errors, one step."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import yaml
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from video_grpo.configs import validate_recipe
from video_grpo.data.sample_weights import (
    SamplerEpoch,
    WeightedRepeatSampler,
    draw_weights,
    mean_reward_weights,
    relative_weights,
)
from video_grpo.explain import explain
from video_grpo.grpo import build_trainer, parse_args
from video_grpo.trainer import VideoGRPOTrainer

from .conftest import SAMPLES

TRAIN_IDS = [json.loads(line)["id"] for line in (SAMPLES / "train.jsonl").read_text().splitlines() if line]


def test_rule_against_a_hand_computation():
    # (1 - m + 1e-8)^2 for m = 0.1, 0.8, 0.5, 1.0: 0.81, 0.04, 0.25, 1e-16; their sum 1.10
    p = mean_reward_weights([0.1, 0.8, 0.5, 1.0], power=2)
    assert p.dtype == torch.float64
    assert p.tolist() == pytest.approx([0.81 / 1.10, 0.04 / 1.10, 0.25 / 1.10, 1e-16 / 1.10], rel=1e-6)
    assert p[0] / p[1] == pytest.approx(20.25, rel=1e-6)  # the docstring's 0.1 against 0.8
    # means outside [0, 1] are clipped, as TimeLens2 clips them; power 0 is uniform; power 1 is linear
    assert mean_reward_weights([-0.5, 1.5, 0.0, 1.0], 2).tolist() == pytest.approx(
        mean_reward_weights([0.0, 1.0, 0.0, 1.0], 2).tolist()
    )
    assert mean_reward_weights([0.1, 0.9, 0.3], 0).tolist() == pytest.approx([1 / 3] * 3)
    assert mean_reward_weights([0.0, 0.5], 1).tolist() == pytest.approx([2 / 3, 1 / 3])


def test_each_epoch_is_timelens2s_weighted_order_without_replacement():
    """On: each epoch is ``torch.multinomial(p, N, replacement=False)`` from a generator seeded once (TimeLens2's
    RepeatSampler): every query once an epoch, the first drawn with probability p, the next epoch the next draw."""
    p = mean_reward_weights([0.1, 0.8, 0.5, 0.3, 0.0, 0.95], power=2)
    sampler = WeightedRepeatSampler(p, mini_repeat_count=1, batch_size=6, seed=5)
    theirs = torch.Generator().manual_seed(5)
    for _ in range(3):  # epochs 0, 1, 2: the first, second and third call on their generator
        expected = torch.multinomial(p, 6, replacement=False, generator=theirs).tolist()
        assert list(sampler) == expected and sorted(expected) == list(range(6))
    # the first query of an epoch is drawn with probability p (20,000 epochs, seeded: deterministic)
    firsts = torch.tensor([next(iter(sampler)) for _ in range(20000)])
    share = torch.bincount(firsts, minlength=6).double() / len(firsts)
    sigma = (p * (1 - p) / len(firsts)).sqrt()
    assert ((share - p).abs() < 5 * sigma).all(), (share, p)
    # a batch of 4 of the 6: the last, incomplete chunk of 2 is dropped, as TRL drops it
    drawn = list(WeightedRepeatSampler(p, mini_repeat_count=1, batch_size=4, seed=5))
    assert (
        len(drawn) == 4
        and drawn
        == torch.multinomial(p, 6, replacement=False, generator=torch.Generator().manual_seed(5)).tolist()[:4]
    )
    assert relative_weights(p, [0, 1, -1]).tolist()[:2] == pytest.approx((6 * p[:2]).tolist())
    assert math.isnan(relative_weights(p, [0, 1, -1])[2])


def test_a_named_epoch_gives_that_epochs_order_in_a_fresh_sampler():
    """A resumed process builds a fresh sampler and names its epoch: it must order that epoch as the
    uninterrupted run did, not as epoch 0; asking for an earlier epoch replays from the seed."""
    p = mean_reward_weights([0.2, 0.4, 0.6, 0.0, 0.9, 0.1, 0.5, 0.7], power=2)
    settings = {"mini_repeat_count": 2, "batch_size": 2, "repeat_count": 1, "seed": 11}
    uninterrupted = WeightedRepeatSampler(p, **settings)
    epochs = [list(uninterrupted) for _ in range(4)]
    assert len({tuple(e) for e in epochs}) == 4
    fresh = WeightedRepeatSampler(p, **settings)
    fresh.set_epoch(2)
    assert list(fresh) == epochs[2]
    assert list(fresh) == epochs[3]  # unnamed: the next epoch
    fresh.set_epoch(1)
    assert list(fresh) == epochs[1]
    # the trainer names the epoch from its state: the whole part of state.epoch, also mid-epoch after a resume
    callback = SamplerEpoch()
    callback.sampler = fresh
    for state_epoch, named in ((0, 0), (1.5, 1), (3.0, 3)):
        callback.on_epoch_begin(None, SimpleNamespace(epoch=state_epoch), None)
        assert fresh.epoch == named


def test_sampler_keeps_trls_layout_and_is_the_same_on_every_rank():
    p = mean_reward_weights([0.2, 0.4, 0.6, 0.0, 0.9, 0.1, 0.5], power=2)
    settings = {"mini_repeat_count": 3, "batch_size": 2, "repeat_count": 2}
    drawn = list(WeightedRepeatSampler(p, seed=7, **settings))
    assert drawn == list(WeightedRepeatSampler(p, seed=7, **settings))  # every rank draws the same sequence
    assert len(drawn) == len(WeightedRepeatSampler(p, seed=7, **settings))
    assert len(drawn) == len(RepeatSampler(range(7), seed=7, **settings))  # 3 chunks of 2, x3 x2 = 36
    block = 2 * 3  # a chunk: 2 prompts, each 3 times in a row; the chunk twice (reused generations)
    for start in range(0, len(drawn), 2 * block):
        chunk = drawn[start : start + block]
        assert chunk == drawn[start + block : start + 2 * block]
        assert chunk[:3] == [chunk[0]] * 3 and chunk[3:] == [chunk[3]] * 3
    assert len(set(drawn)) == 6  # 6 of the 7 rows, each once: without replacement


def _bare_trainer(sample_weights):
    """A VideoGRPOTrainer carrying only what ``_get_train_sampler`` reads: its real method, no model."""
    trainer = object.__new__(VideoGRPOTrainer)
    trainer.sample_weights = sample_weights
    trainer.args = SimpleNamespace(generation_batch_size=8, steps_per_generation=2, seed=3)
    trainer.num_generations, trainer.num_iterations, trainer.shuffle_dataset = 2, 1, True
    trainer.train_dataset = list(range(10))
    return trainer


def test_off_is_trls_own_sampler_and_on_is_the_weighted_one():
    off = _bare_trainer(None)
    ours, trls = off._get_train_sampler(), GRPOTrainer._get_train_sampler(off)
    assert type(ours) is RepeatSampler and list(ours) == list(trls)  # off: TRL's sampler, the same draws
    p = mean_reward_weights([0.0] * 9 + [1.0], 2)
    sampler = _bare_trainer(p)._get_train_sampler()
    assert isinstance(sampler, WeightedRepeatSampler)
    assert (sampler.mini_repeat_count, sampler.batch_size, sampler.repeat_count) == (2, 4, 2)
    assert 9 not in list(sampler)  # weight 1e-16 / 9 against 1 / 9: never drawn in 40 draws


def _per_query(tmp_path, means, field="mean_iou"):
    path = tmp_path / "per_query.jsonl"
    path.write_text("".join(json.dumps({"id": i, "k": 8, field: m}) + "\n" for i, m in means.items()))
    return path


def test_errors_name_the_field_to_fix(tmp_path):
    stats = _per_query(tmp_path, {"a": 0.5, "b": 0.1})
    with pytest.raises(
        ValueError, match=r"sample_weight_field: 'tiou' is not a field of .*per_query.jsonl:1"
    ):
        draw_weights(["a", "b"], stats, "tiou", 2)
    with pytest.raises(
        ValueError, match=r"sample_weight_file: none of the 2 training queries .* has an entry in"
    ):
        draw_weights(["x", "y"], stats, "mean_iou", 2)
    assert draw_weights(["b", "a"], stats, "mean_iou", 2).tolist() == pytest.approx(
        [0.81 / 1.06, 0.25 / 1.06]
    )
    recipe = {"train_file": str(SAMPLES / "train.jsonl"), "output_dir": str(tmp_path), "use_cpu": True}
    recipe["model_name_or_path"] = "not-loaded"  # validate_recipe fails on shuffle_dataset before reading it

    def parse(**values):
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump({**recipe, **values}))
        return parse_args(["--config", str(path)])

    with pytest.raises(
        ValueError, match=r"GRPOScriptArguments.sample_weight_file: not set, but sample_weight"
    ):
        parse(sample_weight_mean_power=2)
    with pytest.raises(
        ValueError, match=r"GRPOScriptArguments.sample_weight_mean_power: must be a number >= 0"
    ):
        parse(sample_weight_mean_power=-1)
    script, training, model = parse(
        sample_weight_mean_power=2, sample_weight_file=str(stats), shuffle_dataset=False
    )
    with pytest.raises(ValueError, match=r"shuffle_dataset: is false, but sample_weight_mean_power > 0"):
        validate_recipe(script, training, model)
    script, _, _ = parse()
    assert script.sample_weight_mean_power == 0 and script.sample_weight_field == "mean_iou"  # off by default


def test_fewer_than_two_answers_or_no_line_count_as_mean_zero(tmp_path, caplog):
    """TimeLens2 gives a query with fewer than 2 rollouts mean 0 (the largest weight); a training query with no line
    in the file counts the same, with one warning giving the count."""
    path = tmp_path / "per_query.jsonl"
    lines = [
        {"id": "a", "k": 8, "mean_iou": 0.5},
        {"id": "b", "k": 1, "mean_iou": 0.9},
        {"id": "c", "k": 0, "mean_iou": 0.0},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with caplog.at_level("WARNING", logger="video_grpo.data.sample_weights"):
        p = draw_weights(["a", "b", "c", "d", "e"], path, "mean_iou", 2)
    assert p.tolist() == pytest.approx(mean_reward_weights([0.5, 0.0, 0.0, 0.0, 0.0], 2).tolist())
    warnings = [r.getMessage() for r in caplog.records if "no entry" in r.getMessage()]
    assert (
        len(warnings) == 1
        and "2 of 5 training queries have no entry" in warnings[0]
        and "['d', 'e']" in warnings[0]
    )
    path.write_text(json.dumps({"id": "a", "k": "eight", "mean_iou": 0.5}) + "\n")
    with pytest.raises(ValueError, match=r"sample_weight_file: .*per_query.jsonl:1: k must be a count"):
        draw_weights(["a"], path, "mean_iou", 2)


def test_a_recipe_with_weights_trains_on_the_drawn_queries(tiny_model_dir, tmp_path):
    """The recipe fields reach the trainer (grpo.build_trainer); one real step trains only on queries drawn by
    weight, and logs the mean relative weight."""
    # every query solved (mean IoU 1, weight 1e-16) except train_003 (mean IoU 0, weight 1): it comes first in the
    # epoch's order, and a step of one prompt trains on it alone
    stats = _per_query(tmp_path, {i: 0.0 if i == "train_003" else 1.0 for i in TRAIN_IDS})
    recipe = yaml.safe_load((SAMPLES.parent / "configs" / "grpo" / "demo_tiny.yaml").read_text())
    recipe.update(
        model_name_or_path=str(tiny_model_dir),
        train_file=str(SAMPLES / "train.jsonl"),
        eval_file=None,
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        sample_weight_mean_power=2,
        sample_weight_file=str(stats),
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in recipe.items() if v is not None}))
    trainer = build_trainer(*parse_args(["--config", str(path)]))
    assert trainer.sample_weights[TRAIN_IDS.index("train_003")] == pytest.approx(1.0)
    seen = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        seen.extend(x["id"] for x in inputs)
        return original(inputs)

    trainer._generate_and_score_completions = spy
    trainer.train()
    assert seen and set(seen) == {"train_003"}
    relative = [
        h["sample_weight/relative_weight"]
        for h in trainer.state.log_history
        if "sample_weight/relative_weight" in h
    ]
    assert relative == pytest.approx([len(TRAIN_IDS)], rel=1e-6)  # N p = 16 x 1 for the only drawn query


def test_explain_shows_the_weights():
    text = explain()
    assert "(e) TimeLens2's draw weights" in text
    assert "p = weight / sum = [0.5420, 0.2943, 0.1502, 0.0135]" in text
    assert "x N p = [2.1682, 1.1772, 0.6006, 0.0541]" in text


def test_the_order_is_timelens2s_draw_to_the_bit():
    """Their build_sample_weights (std power 0) and RepeatSampler, written out from their code's steps: float64
    weights, normalised in float32, renormalised in float64, one multinomial of all rows from a seeded generator."""
    import numpy as np

    from video_grpo.data.sample_weights import WeightedRepeatSampler, mean_reward_weights

    rng = np.random.default_rng(0)
    means = rng.uniform(0, 1, 50_000)
    base = np.power(1.0 - np.clip(means, 0.0, 1.0) + 1e-8, 2.0)
    theirs = torch.tensor(base, dtype=torch.float32)
    theirs = (theirs / theirs.sum()).to(dtype=torch.double)
    generator = torch.Generator()
    generator.manual_seed(42)
    expected = torch.multinomial(
        theirs / theirs.sum(), 50_000, replacement=False, generator=generator
    ).tolist()
    sampler = WeightedRepeatSampler(mean_reward_weights(means.tolist(), 2), mini_repeat_count=1, seed=42)
    assert list(sampler) == expected
