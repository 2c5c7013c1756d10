import math

import pytest

from video_grpo.rewards.functions import (
    REWARD_FUNCS,
    format_reward,
    format_soft_reward,
    iou_reward,
    parse_span,
    resolve_reward_funcs,
    temporal_iou,
)

GOOD = "<think>the square shows up early</think><answer>2.5 to 7.5</answer>"


def test_iou_known_values():
    assert temporal_iou((0, 10), (5, 15)) == pytest.approx(5 / 15)
    assert temporal_iou((0, 10), (0, 10)) == 1.0
    assert temporal_iou((0, 1), (2, 3)) == 0.0
    assert temporal_iou((3, 3), (3, 3)) == 0.0  # empty union is 0, never 1


def test_iou_reward_on_known_spans_and_clipping():
    rewards = iou_reward(
        completions=[GOOD, "<answer>0 to 10</answer>", "<answer>5 to 40</answer>"],
        solution=[[2.5, 7.5], [5, 15], [5, 20]],
        duration=[30, 30, 20],
    )
    assert rewards[0] == pytest.approx(1.0)
    assert rewards[1] == pytest.approx(5 / 15)
    assert rewards[2] == pytest.approx(1.0)  # 5 to 40 is clipped to the 20 s video


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "no answer at all",
        "<answer>soon</answer>",
        "<answer>9 to 3</answer>",
        "<answer>-1 to 3</answer>",
        "<answer>nan to inf</answer>",
        "<answer>1 to 99999999</answer>",
        "<answer>2 to 5",
    ],
)
def test_unparsable_gives_zero(completion):
    assert parse_span(completion) is None
    assert iou_reward(completions=[completion], solution=[[1, 4]], duration=[10]) == [0.0]


@pytest.mark.parametrize(
    ("answer", "span"),
    [
        ("3 to 7", (3, 7)),
        ("3.25 to 7.5", (3.25, 7.5)),
        ("from 3s to 7 seconds", (3, 7)),
        ("0:30 to 1:05", (30, 65)),
        ("1:00:00 to 1:00:30.5", (3600, 3630.5)),
        ("3 - 7", (3, 7)),
    ],
)
def test_span_forms(answer, span):
    assert parse_span(f"<answer>{answer}</answer>") == pytest.approx(span)


def test_last_answer_block_wins():
    assert parse_span("<answer>1 to 2</answer> wait <answer>4 to 6</answer>") == (4, 6)


def test_format_cases():
    cases = {
        GOOD: 1.0,
        f"  {GOOD}\n": 1.0,
        "<think>x</think>\n<answer> 1.0 to 2.0 </answer>": 1.0,
        "<answer>1 to 2</answer><think>x</think>": 0.0,
        "<think>x</think><answer>1 to 2</answer> trailing": 0.0,
        "<think>x</think><answer>later</answer>": 0.0,
        "<think>x<think>y</think><answer>1 to 2</answer>": 0.0,
        "<answer>1 to 2</answer>": 0.0,
        "": 0.0,
    }
    assert format_reward(completions=list(cases)) == list(cases.values())


def test_format_soft_is_graded():
    scores = format_soft_reward(
        completions=[
            "",
            "<think>x</think>",
            "<think>x</think><answer>?</answer>",
            GOOD,
            "<answer>1 to 2</answer>",
        ]
    )
    assert scores == [0.0, 0.25, 0.75, 1.0, 0.5]


def test_conversational_completions():
    conv = [[{"role": "assistant", "content": GOOD}]]
    assert iou_reward(completions=conv, solution=[[2.5, 7.5]], duration=[10]) == [1.0]
    assert format_reward(completions=conv) == [1.0]


def test_rewards_accept_trl_call_signature():
    kwargs = {
        "prompts": [[{"role": "user", "content": "q"}]],
        "completion_ids": [[1, 2]],
        "solution": [[1, 2]],
        "duration": [5.0],
        "trainer_state": None,
        "log_extra": None,
        "log_metric": None,
        "video_frames": [None],
    }
    for func in REWARD_FUNCS.values():
        out = func(completions=[GOOD], **kwargs)
        assert len(out) == 1 and isinstance(out[0], float) and math.isfinite(out[0])


def test_resolve_reward_funcs():
    assert resolve_reward_funcs(["iou", "math:sqrt"])[1] is math.sqrt
    with pytest.raises(ValueError, match="format_soft"):
        resolve_reward_funcs(["iuo"])
    with pytest.raises(ValueError, match="cannot load"):
        resolve_reward_funcs(["no_such_module_xyz:f"])
