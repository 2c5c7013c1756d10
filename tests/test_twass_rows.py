"""The learning benchmark's twass rows on hand-made groups (pure computation, no model): a group of misses is flat
under IoU and ranked once twass is added; a group of one repeated answer is flat under any reward; the recorder
returns the reward it wraps and keeps every group. The rows on real rollouts: tests/test_learning.py."""

from __future__ import annotations

import math

import pytest

from video_grpo.bench import twass_rows
from video_grpo.bench.learning_runs import recording_rollouts
from video_grpo.rewards import iou_reward


def _answer(start: float, end: float) -> str:
    return f"<think>I look for the flash.</think><answer>{start} to {end}</answer>"


def _group(spans: list[tuple[float, float]], truth=(6.0, 9.0)) -> dict:
    return {
        "completions": [_answer(*span) for span in spans],
        "solution": [list(truth)] * len(spans),
        "duration": [16.0] * len(spans),
    }


MISSES = _group([(0.0, 2.0), (1.0, 3.0), (12.5, 14.5), (10.0, 11.0)])  # all disjoint from 6-9: IoU 0
SAME = _group([(5.0, 8.0)] * 4)  # one answer four times
HITS = _group([(6.0, 9.0), (5.0, 8.0), (7.0, 8.0), (0.0, 1.0)])


def test_misses_are_flat_under_iou_alone_and_ranked_with_twass():
    scores = twass_rows.score_group(MISSES)
    alone = twass_rows.summed_rewards(scores, twass_rows.IOU_ALONE)
    with_twass = twass_rows.summed_rewards(scores, twass_rows.WITH_TWASS)
    assert alone == [0.0] * 4
    assert len(set(with_twass)) == 4 and all(0 < r < 1 for r in with_twass), with_twass
    assert with_twass[1] > with_twass[0] and with_twass[3] > with_twass[2]  # nearer misses get more


def test_spread_counts_flat_groups_and_means_the_population_std():
    scored = [twass_rows.score_group(group) for group in (MISSES, SAME, HITS)]
    alone = twass_rows.group_spread(scored, twass_rows.IOU_ALONE)
    with_twass = twass_rows.group_spread(scored, twass_rows.WITH_TWASS)
    assert alone["flat"] == 2 and with_twass["flat"] == 1  # SAME is flat under both
    hits = iou_reward(**HITS)
    mean = sum(hits) / 4
    hits_std = math.sqrt(sum((r - mean) ** 2 for r in hits) / 4)
    assert alone["std"] == pytest.approx(hits_std / 3)  # the two flat groups add 0 to the mean
    assert alone["variance"] == pytest.approx(hits_std**2 / 3)


def test_rows_compare_the_same_groups():
    lines = []
    rows = twass_rows.spread_rows(
        {"ours": [MISSES, HITS], "plain": [SAME]}, lambda *a, **k: lines.append((a, k)) or (a, k)
    )
    (name, ours, baseline, _), extra = rows["twass_flat_groups"]
    assert name == "twass_flat_groups" and extra["groups"] == 3
    assert (ours, baseline) == (1 / 3, 2 / 3)
    assert extra["by_run"] == {
        "ours": {"groups": 2, "flat_twass_iou": 0, "flat_iou": 1},
        "plain": {"groups": 1, "flat_twass_iou": 1, "flat_iou": 1},
    }
    assert extra["same_span_groups"] == 1
    (name, ours, baseline, _), extra = rows["twass_within_group_std"]
    assert name == "twass_within_group_std" and ours > baseline > 0


def test_recorder_returns_the_wrapped_reward_and_keeps_every_group():
    groups: list[dict] = []
    recorded = recording_rollouts(iou_reward, groups, group_size=4)
    batch = {key: MISSES[key] + HITS[key] for key in MISSES}
    conversational = [[{"role": "assistant", "content": text}] for text in batch["completions"]]
    rewards = recorded(completions=conversational, solution=batch["solution"], duration=batch["duration"])
    assert recorded.__name__ == "iou_reward"  # TRL logs it under the same key
    assert rewards == iou_reward(**batch)
    assert groups == [MISSES, HITS]
