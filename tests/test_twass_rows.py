"""The learning benchmark's twass rows on hand-made groups (pure computation, no model): a group of misses is flat
under IoU and ranked once twass is added; a group of one repeated answer is flat under any reward; the recorder
returns the reward it wraps and keeps every group. The rows on real rollouts: tests/test_learning.py.

Also the one fast guard of ``python -m video_grpo.bench.twass_evidence`` (a multi-seed experiment, not in the suite):
the rewards its arms and these rows score with are normalised by the true length and read ``S to E`` answers, so a
regression of the normaliser or the reader fails here, not after an hour of GRPO."""

from __future__ import annotations

import math

import pytest

from video_grpo.bench import twass_evidence, twass_rows
from video_grpo.bench.learning_runs import recording_rollouts
from video_grpo.rewards.functions import REWARD_FUNCS, iou_reward


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


# Truth 6-9 s (3 s). W1 to it: the same span 0; 5-8 s (IoU 0.5) 1 s; the whole video 0-16 s (IoU 0.19) 85/26 s; a
# miss at 12-14 s 5.5 s. Normalised by the true length (3 s) the covering answer scores below the half overlap;
# by the union (3, 4, 16 and 5 s) it scored above it: the old reward's pull towards long spans.
TIGHT_TO_WIDE = _group([(6.0, 9.0), (5.0, 8.0), (0.0, 16.0), (12.0, 14.0)])
BY_TRUTH = [1.0, math.exp(-1 / 3), math.exp(-85 / 26 / 3), math.exp(-5.5 / 3)]
BY_UNION = [1.0, math.exp(-1 / 4), math.exp(-85 / 26 / 16), math.exp(-5.5 / 5)]


def test_twass_is_normalised_by_the_true_length_in_the_bench_and_the_rows():
    for scores in (twass_evidence.score_group(TIGHT_TO_WIDE), twass_rows.score_group(TIGHT_TO_WIDE)):
        assert scores["twass"] == pytest.approx(BY_TRUTH)
        assert (
            scores["twass"][2] < scores["twass"][1]
        )  # covering the truth scores below overlapping half of it
    union = REWARD_FUNCS["twass"](**TIGHT_TO_WIDE, reader="ours", normalizer="union")
    assert union == pytest.approx(BY_UNION) and union[2] > union[1]
    assert twass_rows.twass_params(3.0) == {"reader": "ours", "beta": 3.0}


def test_the_bench_reads_s_to_e_answers_with_our_reader():
    """TimeLens2's reader (the rewards' default) reads JSON only: every ``S to E`` answer of this task would score 0,
    and both arms would train on format alone."""
    assert REWARD_FUNCS["tiou"](**TIGHT_TO_WIDE) == [0.0] * 4  # reader timelens2
    assert REWARD_FUNCS["twass"](**TIGHT_TO_WIDE) == [0.0] * 4
    scores = twass_evidence.score_group(TIGHT_TO_WIDE)
    assert scores["tiou"] == pytest.approx([1.0, 0.5, 3 / 16, 0.0])
    assert scores["format"] == [1.0] * 4
    assert (
        twass_evidence.REWARD_PARAMS["tiou"]["reader"]
        == twass_evidence.REWARD_PARAMS["twass"]["reader"]
        == "ours"
    )


def test_bench_spread_and_paired_interval():
    scored = [twass_evidence.score_group(g) for g in (MISSES, SAME, TIGHT_TO_WIDE)]
    a, b = (twass_evidence.spread(scored, twass_evidence.ARMS[arm]) for arm in ("A", "B"))
    assert (a["flat"], b["flat"]) == (2, 1)  # the misses are flat under tiou + format, ranked with twass
    assert [twass_evidence.all_miss(s) for s in scored] == [True, False, False]
    assert b["variance"] > a["variance"] > 0
    interval = twass_evidence.paired_interval([2.0, 3.0, 4.0, 5.0, 6.0], [1.0] * 5)  # differences 1..5
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)
    assert interval["mean"] == 3.0 and interval["low"] == pytest.approx(3 - half)
    assert interval["high"] == pytest.approx(3 + half)
