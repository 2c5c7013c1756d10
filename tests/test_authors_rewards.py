"""Every preset that follows a published recipe gives each answer the reward its authors' code gives it.

tests/fixtures/authors_rewards.json holds 3,000 answers in the forms a policy writes while it explores
(tests/answer_forms.py, seed 0) with a true solution and a duration each, and the total reward each recipe's own
code gave them, summed as TRL sums reward functions (NaN skipped). It was made by running, outside the repository,
the authors' functions unchanged:

- ``timelens2``: MCG-NJU/TimeLens2 at f07353b, ``grpo/timelens/rewards/funcs.py`` ``score_completion`` with the
  spec of ``grpo/scripts/train_grpo_{4b,8b}.sh`` (``twass1,tiou,parse_penalty``); one reward function in their
  trainer, so a NaN total (twass of an answer ``[1e400, 5]``) counts 0;
- ``timelens``: TencentARC/TimeLens at 5d90c06 (the files last changed in cbc3684), ``training/train/reward_funcs.py`` ``tiou_reward`` (its GRPO
  scripts pass ``--reward_funcs tiou``);
- ``time_r1``: xiaomi-research/time-r1 at 7f2b594 (last changed in 8f9c9df), ``finetune.py`` ``iou_timestamp_reward`` + ``format_reward``
  (``scripts/finetune/run_charades.sh``: ``--reward_funcs iou format``); ``time_r1_iou_v2``: ``iou_timestamp_reward_v2``
  + ``format_reward`` (the paper's reward, ``scripts/posttrain/train_rl.sh``);
- ``timezero``: www-Ye/Time-R1 at d1a0d54 (last changed in bb6eac5), ``src/open_r1/grpo_video.py`` ``iou_timestamp_reward`` + ``format_reward``.

Time-R1 and TimeZero take one true span; a multi-span row gives them its first span, as TimeLens's reward takes it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from video_grpo.rewards.functions import resolve_reward_funcs

ROOT = Path(__file__).resolve().parents[1]
ROWS = json.loads((ROOT / "tests/fixtures/authors_rewards.json").read_text())
PRESETS = {
    "timelens2": sorted((ROOT / "configs/grpo").glob("timelens2_*.yaml")),
    "timelens": sorted((ROOT / "configs/grpo").glob("timelens_*.yaml")),
    "time_r1": sorted((ROOT / "configs/grpo").glob("time_r1_*.yaml")),
    "timezero": sorted((ROOT / "configs/grpo").glob("timezero_*.yaml")),
}
SINGLE_SPAN = ("time_r1", "time_r1_iou_v2", "timezero")


def _solution(row: dict, key: str):
    solution = row["solution"]
    return solution[0] if key in SINGLE_SPAN and isinstance(solution[0], list) else solution


def totals(names: list[str], kwargs: dict | None, weights: list[float] | None, key: str) -> list[float]:
    """Each answer's reward under ``names``, summed with ``weights`` as TRL sums them (NaN skipped)."""
    completions = [[{"role": "assistant", "content": row["answer"]}] for row in ROWS]
    columns = {
        "solution": [_solution(row, key) for row in ROWS],
        "duration": [row["duration"] for row in ROWS],
    }
    weights = weights or [1.0] * len(names)
    per_func = [func(completions=completions, **columns) for func in resolve_reward_funcs(names, kwargs)]
    return [
        sum(w * v for w, v in zip(weights, values, strict=True) if not math.isnan(v))
        for values in zip(*per_func, strict=True)
    ]


def mismatches(got: list[float], key: str) -> list[tuple]:
    return [
        (row["answer"], row["solution"], row[key], value)
        for row, value in zip(ROWS, got, strict=True)
        if abs(value - row[key]) > 1e-9
    ]


@pytest.mark.parametrize(
    "key, preset",
    [(key, path) for key, paths in PRESETS.items() for path in paths],
    ids=lambda v: getattr(v, "name", v),
)
def test_preset_sums_its_rewards_as_its_authors_code(key, preset):
    recipe = yaml.safe_load(preset.read_text())
    got = totals(recipe["reward_funcs"], recipe.get("reward_kwargs"), recipe.get("reward_weights"), key)
    bad = mismatches(got, key)
    assert not bad, (
        f"{preset.name}: {len(bad)} of {len(ROWS)} answers differ from {key}'s code, e.g. {bad[:3]}"
    )


def test_time_r1_paper_reward_is_iou_dist_with_their_reader():
    """Time-R1's paper reward (their iou_v2), for a preset that follows the paper instead of the Charades script."""
    kwargs = {"iou_dist": {"reader": "time_r1"}, "format": {"reader": "time_r1"}}
    assert not mismatches(totals(["iou_dist", "format"], kwargs, None, "time_r1_iou_v2"), "time_r1_iou_v2")


def test_the_check_can_fail_our_own_rules_differ_on_these_answers():
    """Read with our own rules (last span, clipped to the video, the strict format, TimeLens2's old union
    normaliser), the same answers get other rewards: the fixture holds the forms where the recipes disagree."""
    ours = {
        "timelens2": (
            ["twass", "tiou", "parse_penalty"],
            {
                "twass": {"reader": "ours", "normalizer": "union"},
                "tiou": {"reader": "ours"},
                "parse_penalty": {"reader": "ours"},
            },
        ),
        "timelens": (["iou_answer_only"], {"iou_answer_only": {"reader": "ours"}}),
        "time_r1": (["iou", "format"], None),
        "timezero": (["iou", "format"], None),
    }
    differing = {key: len(mismatches(totals(*ours[key], None, key), key)) for key in ours}
    assert all(count >= 300 for count in differing.values()), differing
    # the forms cover every recipe's canonical answer and the ones a policy should not write
    for needle in ("```json", "<thinking>", "The event happens in", " and ", "1e400", "NaN", "<answer>"):
        assert sum(needle in row["answer"] for row in ROWS) >= 20, needle


def test_training_evaluation_and_curation_read_a_timelens2_answer_alike(tmp_path, capsys):
    """Within a TimeLens2 preset, the tiou reward, ``evaluate score --span_scoring set`` and ``curate --span_scoring
    set`` (whose mean tIoU becomes the draw weights) read and score every answer the same way."""
    from video_grpo import curate, evaluate
    from video_grpo.rewards.functions import recipe_reader

    preset = PRESETS["timelens2"][0]
    recipe = yaml.safe_load(preset.read_text())
    assert recipe_reader(recipe["reward_funcs"], recipe.get("reward_kwargs")) == "timelens2"
    rows = ROWS[:400]
    funcs = resolve_reward_funcs(recipe["reward_funcs"], recipe.get("reward_kwargs"))
    tiou = funcs[recipe["reward_funcs"].index("tiou")]
    training = tiou(completions=[r["answer"] for r in rows], solution=[r["solution"] for r in rows])
    # evaluate score, the scoring and reader taken from the preset
    records = [
        {"id": f"q{i // 8}", "sample": i % 8, "output": r["answer"], "solution": rows[i // 8 * 8]["solution"]}
        for i, r in enumerate(rows)
    ]
    for record in records:
        record.update(video=str(tmp_path / "v.mp4"), duration=60.0, sentence="a person opens a door")
    per_answer = tiou(completions=[r["output"] for r in records], solution=[r["solution"] for r in records])
    predictions = tmp_path / "samples.jsonl"
    predictions.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert (
        evaluate.main(
            ["score", "--predictions", str(predictions), "--config", str(preset), "--span_scoring", "set"]
        )
        == 0
    )
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["reader"] == "timelens2"
    assert metrics["mIoU"] == pytest.approx(100 * sum(per_answer) / len(per_answer), abs=1e-9)
    own = [evaluate.score_output(r["answer"], r["solution"], "set", "timelens2")[0] for r in rows]
    assert own == training
    # curate, the reader taken from the preset: each query's mean tIoU is the mean of its answers' tiou rewards
    args = ["--predictions", str(predictions), "--config", str(preset), "--span_scoring", "set"]
    curate.main(
        [*args, "--output_dir", str(tmp_path / "curate"), "--video_root", str(tmp_path), "--min_iou", "0"]
    )
    per_query = [json.loads(line) for line in (tmp_path / "curate/per_query.jsonl").read_text().splitlines()]
    assert len(per_query) == 50
    for query in per_query:
        k = int(query["id"][1:])
        assert query["mean_iou"] == pytest.approx(sum(per_answer[8 * k : 8 * k + 8]) / 8, abs=1e-12)
    # our reader scores these answers otherwise: the preset's reader is what made them agree
    ours = evaluate.score_records(
        [{**r, "duration": 60.0} for r in records], span_scoring="set", reader="ours"
    )
    assert abs(ours["mIoU"] - metrics["mIoU"]) > 1
