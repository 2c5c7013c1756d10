"""The graded rewards, reward parameters, plug-ins, and robustness against adversarial completions."""

from __future__ import annotations

import math
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from video_grpo.data.dataset import build_dataset
from video_grpo.rewards.functions import (
    REWARD_FUNCS,
    iou_dist_reward,
    length_penalty_reward,
    multi_span_iou_reward,
    resolve_reward_funcs,
)

from .test_trainer import SAMPLING, make_trainer


def test_iou_dist():
    out = iou_dist_reward(
        completions=["<answer>1 to 5</answer>", "<answer>0 to 4</answer>", "<answer>6 to 9</answer>"],
        solution=[[0, 4]] * 3,
        duration=[10] * 3,
    )
    assert out == pytest.approx([0.6 * 0.9 * 0.9, 1.0, 0.0])


def test_multi_span_iou_union_matching():
    gt = [[0, 2], [4, 6]]
    out = multi_span_iou_reward(
        completions=[
            "<answer>0 to 2; 4 to 6</answer>",
            "<answer>0 to 6</answer>",
            "<answer>0 to 2, 0 to 2</answer>",
            "<answer>4 to 6</answer>",
            "<answer>none</answer>",
        ],
        solution=[gt] * 5,
        duration=[10] * 5,
    )
    assert out == pytest.approx([1.0, 4 / 6, 0.5, 0.5, 0.0])
    assert multi_span_iou_reward(completions=["<answer>1 to 3</answer>"], solution=[[1, 3]]) == [1.0]


def test_length_penalty_and_params_from_config():
    long_think = "<think>" + " ".join(["w"] * 30) + "</think><answer>1 to 2</answer>"
    assert length_penalty_reward(completions=[long_think]) == [0.0]  # default limit 256 words
    bound = resolve_reward_funcs(["length_penalty"], {"length_penalty": {"max_think_words": 20}})[0]
    assert bound(completions=[long_think]) == pytest.approx([-0.5])
    assert bound.__name__ == "length_penalty_reward"
    with pytest.raises(ValueError, match="has no parameter 'limit'"):
        resolve_reward_funcs(["length_penalty"], {"length_penalty": {"limit": 20}})
    with pytest.raises(ValueError, match="not in reward_funcs"):
        resolve_reward_funcs(["iou"], {"length_penalty": {"max_think_words": 20}})


ADVERSARIAL = [
    "1" * 1_000_000,
    "<answer>" + "9" * 1_000_000 + " to 1</answer>",
    "<think>" * 100_000 + "</think>" * 100_000,
    "<answer>" * 50_000 + "1 to 2" + "</answer>" * 50_000,
    "1 " + " " * 1_000_000 + "x",
    "<think>" + "1 to " * 200_000 + "</think><answer>" + "1:" * 100_000 + "</answer>",
    "<answer>" + "- " * 500_000 + "</answer>",
    "\x00<answer>\u2028 3 to 4 \ud7ff</answer>",
]


@pytest.mark.parametrize("name", sorted(REWARD_FUNCS))
def test_adversarial_completions_do_not_hang_or_raise(name):
    func = REWARD_FUNCS[name]
    for text in ADVERSARIAL:
        started = time.perf_counter()
        out = func(completions=[text], solution=[[1.0, 2.0]], duration=[10.0])
        # A generous guard against catastrophic regex backtracking (which would take hours), not a benchmark.
        assert time.perf_counter() - started < 10, (name, text[:40])
        assert len(out) == 1 and isinstance(out[0], float) and math.isfinite(out[0])


PIECES = [*"0123456789.:- tosecnd\n;,[]", "<think>", "</think>", "<answer>", "</answer>", " to ", "seconds"]
completion_text_strategy = st.lists(st.sampled_from(PIECES), max_size=80).map("".join) | st.text(max_size=200)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    completion=completion_text_strategy,
    start=st.floats(0, 100),
    length=st.floats(0.1, 50),
    duration=st.floats(1, 200),
    conversational=st.booleans(),
)
def test_rewards_never_raise_and_stay_in_range(completion, start, length, duration, conversational):
    completions = [[{"role": "assistant", "content": completion}]] if conversational else [completion]
    for name, func in REWARD_FUNCS.items():
        out = func(completions=completions, solution=[[start, start + length]], duration=[duration])
        assert len(out) == 1 and isinstance(out[0], float) and math.isfinite(out[0]), name
        low = -1.0 if name in ("length_penalty", "parse_penalty") else 0.0
        assert low <= out[0] <= 1.0 + 1e-9, (name, completion, out)


def test_plugin_reward_from_outside_the_package_trains_one_step(
    tiny_model_dir, train_file, tmp_path, monkeypatch
):
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "my_grounding_rewards.py").write_text(
        textwrap.dedent("""
        from video_grpo.rewards.functions import completion_text

        CALLS = []

        def answer_length(completions, solution, duration, **kwargs):
            CALLS.append(len(completions))
            return [min(1.0, len(completion_text(c)) / 100) for c in completions]
    """)
    )
    monkeypatch.syspath_prepend(str(plugin_dir))
    reward_funcs = resolve_reward_funcs(["iou", "my_grounding_rewards:answer_length"])
    trainer = make_trainer(
        tiny_model_dir, build_dataset(train_file, sampling=SAMPLING), tmp_path, reward_funcs=reward_funcs
    )
    trainer.train()
    import my_grounding_rewards

    assert my_grounding_rewards.CALLS and my_grounding_rewards.CALLS[0] == 4
    assert any("rewards/answer_length/mean" in entry for entry in trainer.state.log_history)
