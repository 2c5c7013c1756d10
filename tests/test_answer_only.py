"""TimeLens's answer-only setting: the prompt that asks for one sentence, the parser and the IoU-only reward."""

from __future__ import annotations

import pytest

from video_grpo.configs import TIMELENS_PROMPT, TIMELENS_PROMPT_TEXT_TIMESTAMPS, GRPOScriptArguments
from video_grpo.data.dataset import build_prompt
from video_grpo.evaluate import parse_prediction
from video_grpo.rewards.functions import (
    ANSWER_ONLY_TEMPLATE,
    REWARD_FUNCS,
    format_reward,
    iou_answer_only_reward,
    iou_reward,
    parse_answer_only,
    render_answer,
)


def test_the_prompt_asks_for_the_sentence_the_parser_reads():
    text = build_prompt("a man opens the door", 30.0, TIMELENS_PROMPT)[0]["content"][1]["text"]
    assert text == (
        "Please find the visual event described by the sentence 'a man opens the door', determining its "
        "starting and ending times. The format should be: 'The event happens in <start time> - <end time> "
        "seconds'."
    )
    assert TIMELENS_PROMPT_TEXT_TIMESTAMPS.startswith(
        "You are given a video with multiple frames. The numbers before each video frame indicate its "
        "sampling timestamp (in seconds). Please find"
    )
    assert "<think>" not in TIMELENS_PROMPT and "<answer>" not in TIMELENS_PROMPT


@pytest.mark.parametrize(
    ("answer", "span"),
    [
        ("The event happens in 12.5 - 17.0 seconds.", (12.5, 17.0)),
        ("The event happens in 3 - 8 seconds", (3.0, 8.0)),
        ("The event happens in 1:05 - 1:10 seconds.", (65.0, 70.0)),
        ("The event happens in 0.0 - 5.0 seconds, 7.0 - 9.0 seconds.", (7.0, 9.0)),  # the last span
        ("<answer>2 to 4</answer> The event happens in 5 - 9 seconds.", (2.0, 4.0)),  # a tag block wins
        ("The event happens in 9 - 3 seconds.", None),  # S > E
        ("The event happens early on.", None),
        ("", None),
    ],
)
def test_parse_answer_only(answer, span):
    assert parse_answer_only(answer) == span
    assert parse_prediction(answer) == span  # evaluation reads an answer the same way


def test_sentence_round_trips_through_render_and_parse():
    sentence = render_answer(ANSWER_ONLY_TEMPLATE, 3.04, 7.26)
    assert sentence == "The event happens in 3.0 - 7.3 seconds."  # one decimal, as TimeLens writes its target
    assert parse_answer_only(sentence) == (3.0, 7.3)


def test_iou_only_reward_scores_the_sentence_and_needs_no_tags():
    completions = [
        "The event happens in 0.0 - 10.0 seconds.",  # IoU with [5, 15]: 5/15
        [{"role": "assistant", "content": "The event happens in 5 - 15 seconds."}],  # conversational: 1
        "The event happens in 25.0 - 40.0 seconds.",  # past the 30 s video: [25, 40] vs [20, 30] = 5/20
        "I do not know.",  # 0
        "The event happens in 1 - 3 seconds and 5 - 8 seconds.",  # two ranges: TimeLens scores the first
    ]
    solution = [[5, 15], [5, 15], [20, 30], [1, 2], [5, 8]]
    # TimeLens's tiou_reward (the default reader): the first pair, nothing clipped
    rewards = iou_answer_only_reward(completions, solution, duration=[30.0] * 5)
    assert rewards == pytest.approx([1 / 3, 1.0, 0.25, 0.0, 0.0])
    # our reader: the last span, clipped to the video ([25, 30] vs [20, 30] = 0.5)
    ours = iou_answer_only_reward(completions, solution, duration=[30.0] * 5, reader="ours")
    assert ours == pytest.approx([1 / 3, 1.0, 0.5, 0.0, 1.0])
    # the tagged IoU and the format reward give these answers nothing: that is why the setting has its own reward
    assert iou_reward(completions, solution, duration=[30.0] * 5) == [0.0] * 5
    assert format_reward(completions) == [0.0] * 5
    assert REWARD_FUNCS["iou_answer_only"] is iou_answer_only_reward


def test_recipe_without_a_format_term_parses_and_a_contradictory_one_fails():
    args = GRPOScriptArguments(reward_funcs=["iou_answer_only"], prompt_template=TIMELENS_PROMPT)
    assert args.reward_funcs == ["iou_answer_only"]
    with pytest.raises(ValueError, match="reward_funcs.*iou_answer_only.*format reward"):
        GRPOScriptArguments(reward_funcs=["iou_answer_only", "format"], prompt_template=TIMELENS_PROMPT)


def test_presets_carry_timelens_prompts_and_reward():
    import yaml

    from .conftest import REPO

    seven = yaml.safe_load((REPO / "configs/grpo/timelens_qwen2_5_vl_7b.yaml").read_text())
    eight = yaml.safe_load((REPO / "configs/grpo/timelens_qwen3_vl_8b.yaml").read_text())
    assert seven["prompt_template"] == TIMELENS_PROMPT_TEXT_TIMESTAMPS and seven["frame_timestamps_in_text"]
    assert eight["prompt_template"] == TIMELENS_PROMPT and "frame_timestamps_in_text" not in eight
    for preset in (seven, eight):
        assert (
            preset["reward_funcs"] == ["iou_answer_only"]
            and preset["answer_template"] == ANSWER_ONLY_TEMPLATE
        )
        assert preset["scale_rewards"] == "none" and preset["lr_scheduler_type"] == "constant"
