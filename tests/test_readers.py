"""The readers of video_grpo.rewards.readers, rule by rule as their authors' code reads answers (the answer-by-answer check
against their code is tests/test_authors_rewards.py), and the defects of issue 44 on the reward path."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from video_grpo.configs import GRPOScriptArguments
from video_grpo.rewards import readers
from video_grpo.rewards.functions import REWARD_FUNCS, iou_dist_reward, recipe_reader, resolve_reward_funcs


def test_timelens2_reads_json_from_the_answer_block_or_the_whole_text():
    read = readers.timelens2_spans
    # 1. the <answer> block if there is one (their <thinking> or a bare block), else the whole text
    assert read("<think>[[1, 2]]</think><answer>[[3, 4]]</answer>") == [(3, 4)]
    assert read("<thinking>x</thinking>\n<answer> [[3, 4]] </answer>") == [(3, 4)]
    assert read("[[3, 4]]") == [(3, 4)]
    assert read("<answer>[[1, 2]]</answer> <answer>[[3, 4]]</answer>") == [(1, 2)]  # the first block
    # 2. candidates in order: the text, a ```json fence, each balanced [[...]]: the first that parses wins
    assert read("```json\n[[5, 6]]\n```") == [(5, 6)]
    assert read("The spans are [[5, 6], [8, 9]] and [[1, 2]].") == [(5, 6), (8, 9)]
    assert read("[[5, 6],]") is None  # not JSON, and its balanced [[...]] is the same text
    assert read("[[5, 6]] trailing") == [(5, 6)]
    # 3. JSON numbers with exponents count; a reversed pair is put in order; numbers in strings count
    assert read("[[1.2e1, 1.5e1]]") == [(12.0, 15.0)]
    assert read("[[9, 4]]") == [(4, 9)]
    assert read('[["1.5", "3"]]') == [(1.5, 3.0)]
    # 4. a range in prose is not a span, and it does not add one before the JSON
    assert read("at 2 - 4 s") is None
    assert read("From 2 - 4 s the man walks; [[10, 12]]") == [(10, 12)]
    # 5. every pair must have start < end
    assert read("[[3, 3]]") is None and read("[[1, 2], [4, 4]]") is None
    # nested and flat forms, a confidence after the pair
    assert read("[[[7, 8]]]") == [(7, 8)] and read("[7, 8]") == [(7, 8)] and read("[[7, 8, 0.9]]") == [(7, 8)]
    assert read("no answer") is None and read("") is None


def test_timelens2_set_iou_merges_predictions_not_truth_and_clips_nothing():
    # overlapping predictions merge to [0, 4]; overlapping true spans are counted twice, as theirs
    assert readers.timelens2_set_iou([(0, 3), (1, 4)], [(0, 4)]) == pytest.approx(1.0)
    # overlaps 2 + 3 over 4 + 5 - 5: 5/4, clipped to 1
    assert readers.timelens2_set_iou([(0, 4)], [(0, 2), (1, 4)]) == 1.0
    assert readers.timelens2_set_iou([(0, 2)], [(0, 2), (1, 4)]) == pytest.approx(3 / (2 + 5 - 3))
    reward = REWARD_FUNCS["tiou"](["[[25, 40]]"], solution=[[20, 30]], duration=[30.0])
    assert reward == [pytest.approx(5 / 20)]  # not clipped to the 30 s video (which would give 0.5)


def test_twass_normalises_by_the_merged_true_length():
    """TimeLens2's f07353b: a broad answer no longer enlarges its own normaliser. For the truth [6, 9] in a 30 s
    video, the covering [4, 11] now ranks below the better [5, 8] when summed with tiou, as the issue shows."""
    twass, tiou = REWARD_FUNCS["twass"], REWARD_FUNCS["tiou"]
    whole = twass(["[[0, 30]]"], solution=[[6, 9]])[0]
    assert whole == pytest.approx(math.exp(-53 / 18)) == pytest.approx(0.0526, abs=1e-4)
    assert twass(["[[0, 30]]"], solution=[[6, 9]], normalizer="union")[0] == pytest.approx(0.745, abs=1e-3)

    def total(answer: str, **kwargs) -> float:
        return twass([answer], solution=[[6, 9]], **kwargs)[0] + tiou([answer], solution=[[6, 9]])[0]

    assert total("[[5, 8]]") > total("[[4, 11]]")
    assert total("[[5, 8]]", normalizer="union") < total("[[4, 11]]", normalizer="union")


def test_timelens_reads_the_first_pair_turning_to_into_a_dash():
    first = readers.timelens_first_span
    assert first("The event happens in 1 - 3 seconds and 5 - 8 seconds.") == (1.0, 3.0)
    assert first("The event happens in 00:12 - 00:17.") == (12.0, 17.0)
    assert first("from 4 to 9") == (4.0, 9.0)
    assert first("Starting time: 0.8 seconds. Ending time: 1.1 seconds") == (0.8, 1.1)
    assert first("The event happens in 9 - 4 seconds.") is None  # start >= end: reward 0
    # the answer block only when the text starts with <think>...</think><answer>
    assert first("<think>1 - 2</think><answer>5 - 6</answer>") == (5.0, 6.0)
    assert first(" <think>1 - 2</think><answer>5 - 6</answer>") == (1.0, 2.0)
    # evaluation skips the "to" -> "-" step: "photo 3 to 5" reads 3 - 5 in training only
    assert readers.timelens_pairs("a photo 3 4 then 5 to 6", to_as_dash=True) == [(5.0, 6.0)]
    assert readers.timelens_pairs("a photo 3 4 then 5 to 6") == [(5.0, 6.0)]
    assert readers.timelens_pairs("see 3 4 at 5 7") == [(3.0, 4.0), (5.0, 7.0)]


FIFTEEN_FORMS = {  # the Time-R1 / TimeZero answer forms of issue 44: (answer, their span, their format)
    "<think>a</think><answer>2.5 to 6</answer>": ((2.5, 6.0), 1.0),
    "<think>a</think><answer>2.5 and 6</answer>": ((2.5, 6.0), 1.0),
    "<think>a</think><answer>2.5s to 6s</answer>": (None, 1.0),
    "<think>a</think><answer>2.5 - 6</answer>": (None, 1.0),
    "<think>a</think><answer>00:02 to 00:06</answer>": ((2.0, 0.0), 1.0),  # "02 to 00": reversed, IoU 0
    "<think>a</think><answer>6 to 2.5</answer>": ((6.0, 2.5), 1.0),
    "<think>a</think><answer>no idea</answer>": (None, 1.0),
    "<think>a</think><answer>2.5 to 60</answer>": ((2.5, 60.0), 1.0),  # past a 30 s video: not clipped
    "<think>a</think><answer>1 to 2</answer><answer>2.5 to 6</answer>": ((2.5, 6.0), 1.0),
    "<think>a</think><answer>2.5  to  6</answer>": (None, 1.0),
    "<think>a</think><answer>1 to 2, then 2.5 to 6</answer>": ((2.5, 6.0), 1.0),
    "  <think>a</think>\n<answer>2.5 TO 6</answer>\n": ((2.5, 6.0), 1.0),
    "<answer>2.5 to 6</answer>": ((2.5, 6.0), 0.0),
    "2.5 to 6": (None, 0.0),
    "<think>a<answer>2.5 to 6</answer>": ((2.5, 6.0), 0.0),
}


@pytest.mark.parametrize("answer", FIFTEEN_FORMS)
def test_time_r1_reads_the_last_to_or_and_of_the_last_block(answer):
    span, fmt = FIFTEEN_FORMS[answer]
    assert readers.time_r1_span(answer) == span
    assert readers.time_r1_format(answer) == bool(fmt)
    kwargs = {"iou": {"reader": "time_r1"}, "format": {"reader": "time_r1"}}
    iou, form = resolve_reward_funcs(["iou", "format"], kwargs)
    expected = 0.0 if span is None else readers.time_r1_iou(span, (2.5, 6.0))
    assert iou([answer], solution=[[2.5, 6.0]], duration=[30.0]) == [pytest.approx(expected)]
    assert form([answer]) == [fmt]


# Their regular expressions as published; ours match the same text without their quadratic scans.
THEIRS = [
    (r"(\d+\.?\d*)\s*-\s*(\d+\.?\d*)", 0, readers._RANGES[0]),
    (r"(\d+\.?\d*)\s+to\s+(\d+\.?\d*)", 0, readers._RANGES[1]),
    (r"(\d+\.?\d*) (to|and) (\d+\.?\d*)", re.IGNORECASE, readers._TO_OR_AND),
]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from([*"0123456789.- \tx:", "to", "and", "TO", " to ", "\u0663", "12.5"]), max_size=30
    )
)
def test_linear_patterns_find_what_their_patterns_find(pieces):
    text = "".join(pieces)
    for pattern, flags, ours in THEIRS:
        assert re.compile(pattern, flags).findall(text) == ours.findall(text), (pattern, text)


def test_iou_dist_scores_a_multi_span_solution_by_its_best_window():
    # issue 44: this raised TypeError on the list-of-spans solution every multi-span file produces
    assert iou_dist_reward(["<answer>1 to 3</answer>"], [[[1.0, 3.0]]], duration=[10.0]) == [1.0]
    two = iou_dist_reward(["<answer>5 to 7</answer>"], [[[1.0, 3.0], [5.0, 7.0]]], duration=[10.0])
    assert two == [1.0]
    assert iou_dist_reward(["<answer>5 to 7</answer>"], [[5.0, 7.0]], duration=[10.0]) == [1.0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"twass": {"beta": 0}}, "beta must be a positive number"),
        ({"twass": {"beta": "1"}}, "beta must be a positive number"),
        ({"twass": {"beta": float("nan")}}, "beta must be a positive number"),
        ({"twass": {"normalizer": "pred"}}, "normalizer must be one of"),
        ({"twass": {"reader": "time_r1"}}, "reader 'time_r1' is not one of"),
        ({"iou": {"reader": "timelens2"}}, "reader 'timelens2' is not one of"),
    ],
)
def test_bad_reward_parameters_fail_when_the_recipe_is_parsed(kwargs, message):
    """Issue 44: a bad beta was reported at the first reward call, after the model had loaded."""
    names = ["iou", "twass"]
    with pytest.raises(ValueError, match=f"reward_funcs: .*{re.escape(message)}"):
        GRPOScriptArguments(reward_funcs=names, reward_kwargs=kwargs, train_file="unused")


def test_recipe_reader_is_the_set_rewards_reader():
    assert recipe_reader(["twass", "tiou", "parse_penalty"]) == "timelens2"
    assert recipe_reader(["iou", "format"]) == "ours"
    assert recipe_reader(["tiou", "format"], {"tiou": {"reader": "ours"}}) == "ours"
    with pytest.raises(ValueError, match="different readers"):
        recipe_reader(["tiou", "twass"], {"tiou": {"reader": "ours"}})
