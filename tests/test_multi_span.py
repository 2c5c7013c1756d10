"""Multi-span answers: TimeLens2's JSON form read beside ``S to E``, written from multi-span solutions, and scored
as TimeLens2's evaluation scores span sets."""

from __future__ import annotations

import functools

import pytest

from video_grpo.evaluate import score_records
from video_grpo.rewards.answers import (
    DEFAULT_ANSWER_TEMPLATE,
    JSON_ANSWER_TEMPLATE,
    parse_answer_spans,
    parse_span,
    parse_span_in,
    parse_spans_in,
    render_answer,
    render_solution,
)
from video_grpo.rewards.functions import REWARD_FUNCS, SET_REWARDS, format_reward


def test_json_form_reads_beside_s_to_e():
    assert parse_spans_in("[[0, 3.5], [10, 12]]") == [(0, 3.5), (10, 12)]
    assert parse_spans_in("[12.5, 20]") == [(12.5, 20)]
    assert parse_spans_in("[[74.0s, 77.0s]]") == [(74, 77)]  # a unit after each time, as in TimeLens2's data
    assert parse_spans_in("[[01:38, 01:45], [00:03:46, 00:03:52]]") == [(98, 105), (226, 232)]
    assert parse_spans_in("first 1 to 2, then [[5, 6]]") == [(1, 2), (5, 6)]  # both forms, in written order
    assert parse_span_in("[[0, 3.5], [10, 12]]") == (10, 12)  # a single-span reader takes the last
    assert parse_span_in("[[10, 12]] or 1 to 2") == (1, 2)
    assert parse_span("<think>[[0, 1]]</think><answer>[[3, 4]]</answer>") == (3, 4)
    for invalid in ("[[5, 3]]", "[[-1, 3]]", "[[0, 2], [4, -1]]", "[[0, 2], [1:75, 3]]", "[[0, 2000000]]"):
        assert parse_spans_in(invalid) is None, invalid
    for not_a_span in ("[]", "[[1]]", "[1, 2, 3]", "[[a, b]]", "[0.5]"):
        assert parse_spans_in(not_a_span) is None, not_a_span
    # TimeLens2 answers are untagged: the whole completion is the answer when it has no block
    assert parse_answer_spans("[[1, 2], [3, 4]]") == [(1, 2), (3, 4)]
    assert parse_answer_spans("[[1, 2]] <answer>5 to 6</answer>") == [(5, 6)]  # a block wins


def test_json_answers_get_the_same_rewards_as_s_to_e_answers():
    ours = "<think>x</think><answer>3 to 7</answer>"
    json_form = "<think>x</think><answer>[[3, 7]]</answer>"
    for name in (
        "iou",
        "format",
        "format_soft",
        "iou_dist",
        "multi_span_iou",
        "twass",
        "tiou",
        "parse_penalty",
    ):
        # TimeLens2's rewards read JSON only by default (their reader); ours reads both forms
        func = functools.partial(REWARD_FUNCS[name], **({"reader": "ours"} if name in SET_REWARDS else {}))
        assert func([json_form], solution=[[2, 8]], duration=[10.0]) == func(
            [ours], solution=[[2, 8]], duration=[10.0]
        ), name
    # a multi-span solution: `iou` scores its one (last) span against the set instead of failing
    iou = REWARD_FUNCS["iou"](
        ["<answer>4 to 6</answer>"] * 2, solution=[[[0, 2], [4, 6]], [[4, 6]]], duration=[10.0] * 2
    )
    assert iou == [pytest.approx(0.5), 1.0]
    multi = ["<answer>[[0, 2], [5, 6]]</answer>", "<answer>0 to 2; 5 to 6</answer>"]
    scores = REWARD_FUNCS["multi_span_iou"](multi, solution=[[[0, 2], [4, 6]]] * 2, duration=[10.0] * 2)
    assert scores == [pytest.approx(3 / 4)] * 2


def test_templates_write_multi_span_solutions_that_read_back():
    solution = [[1.25, 4.0], [10.0, 12.5]]
    answer = render_solution(JSON_ANSWER_TEMPLATE, solution, decimals=1)
    assert answer == (
        "<think>The event is visible at [[1.2, 4.0], [10.0, 12.5]] seconds.</think>"
        "<answer>[[1.2, 4.0], [10.0, 12.5]]</answer>"
    )
    assert parse_answer_spans(answer) == [(1.2, 4.0), (10.0, 12.5)]
    assert format_reward([answer]) == [1.0]
    with pytest.raises(ValueError, match=r"\{spans\}"):
        render_solution(DEFAULT_ANSWER_TEMPLATE, solution)
    # one span: {spans} is that span, and the old templates write what they always wrote
    assert render_solution("{spans}", [3, 7.04]) == "[[3.0, 7.0]]"
    assert render_solution(DEFAULT_ANSWER_TEMPLATE, [3, 7.04], "q") == render_answer(
        DEFAULT_ANSWER_TEMPLATE, 3, 7.04, "q"
    )
    assert render_solution(DEFAULT_ANSWER_TEMPLATE, [[3, 7.04]], "q") == render_answer(
        DEFAULT_ANSWER_TEMPLATE, 3, 7.04, "q"
    )


def timelens2_overlap_ratio(pred, gt) -> float:
    """VLMEvalKit's multi-span IoU as TimeLens2's evaluation computes it, transcribed as a formula: merge the
    predicted spans (not the true ones), sum the pairwise overlaps, divide by |pred| + |gt| - overlaps."""
    merged = []
    for s, e in sorted(pred):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    inter = sum(max(0.0, min(e, g1) - max(s, g0)) for s, e in merged for g0, g1 in gt)
    union = sum(e - s for s, e in merged) + sum(g1 - g0 for g0, g1 in gt) - inter
    return inter / union


def record(output, solution, duration=30.0):
    return {"output": output, "solution": solution, "duration": duration}


def test_set_scoring_follows_timelens2s_evaluation():
    cases = [
        ("<answer>[[0, 2], [1, 3], [10, 12]]</answer>", [[0, 3], [11, 15]]),  # 4 / 8
        ("<answer>0 to 2; 1 to 3; 10 to 12</answer>", [[0, 3], [11, 15]]),
        ("<answer>[[4, 6]]</answer>", [[0, 2], [4, 6]]),  # one of two windows: 2 / 4
        ("[[5, 9], [20, 21]]", [[6, 10]]),  # untagged
        ("<answer>[[0, 10]]</answer>", [[2, 4], [6, 8]]),  # one span over both windows pays for the gap
    ]
    metrics = score_records([record(o, s) for o, s in cases], span_scoring="set")
    expected = [timelens2_overlap_ratio(parse_answer_spans(o), s) for o, s in cases]
    assert expected[0] == pytest.approx(0.5) and expected[2] == pytest.approx(0.5)
    assert metrics["mIoU"] == pytest.approx(100 * sum(expected) / len(cases))
    assert metrics["span_scoring"] == "set" and metrics["num_parse_failures"] == 0
    # best_window (the default) is unchanged: the last span, best IoU over the windows
    assert score_records([record(*cases[2])])["mIoU"] == 100.0
    assert score_records([record(*cases[2])])["span_scoring"] == "best_window"


def test_set_scoring_equals_best_window_for_single_spans():
    records = [
        record("<think>x</think><answer>0 to 10</answer>", [5, 15]),
        record("<answer>[[2, 8]]</answer>", [0, 10]),
        record("the event is from 4 to 9 seconds", [4, 9]),
        record("<answer>9 to 3</answer>", [3, 9]),  # S > E: a failure either way
        record("no idea", [1, 2]),
        record("<answer>25 to 40</answer>", [20, 30]),  # no clamping
        record("<answer>5 to 5</answer>", [5, 5]),  # empty union: 0
    ]
    best, as_set = score_records(records), score_records(records, span_scoring="set")
    assert {k: v for k, v in best.items() if k != "span_scoring"} == {
        k: v for k, v in as_set.items() if k not in ("span_scoring", "reader")
    }
    with pytest.raises(ValueError, match="span_scoring"):
        score_records(records, span_scoring="best")


def test_tiou_reads_untagged_json_as_multi_span_iou_reads_a_tagged_answer():
    """TimeLens2's tiou: the set IoU of every span, from the whole completion when it has no answer block (where
    `iou` and `multi_span_iou` give 0)."""
    from video_grpo.rewards.functions import REWARD_FUNCS

    solution = [[[10.0, 20.0], [30.0, 40.0]]]
    for spans in ("[[10.0, 20.0]]", "[[12, 18], [30, 45]]", "[[50, 60]]"):
        tagged = REWARD_FUNCS["multi_span_iou"](completions=[f"<answer>{spans}</answer>"], solution=solution)
        assert REWARD_FUNCS["tiou"](completions=[spans], solution=solution) == tagged
        assert REWARD_FUNCS["tiou"](completions=[f"<answer>{spans}</answer>"], solution=solution) == tagged
        assert REWARD_FUNCS["multi_span_iou"](completions=[spans], solution=solution) == [0.0]
    assert REWARD_FUNCS["tiou"](completions=["[[12, 18], [30, 45]]"], solution=solution)[0] == (6 + 10) / 25
    assert REWARD_FUNCS["tiou"](completions=["no spans"], solution=solution) == [0.0]
