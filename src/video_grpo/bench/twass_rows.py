"""The learning benchmark's ``twass`` rows: does TimeLens2's temporal Wasserstein reward give GRPO a signal
where the IoU reward gives none, and does training with it answer better?

A GRPO group whose G rewards are all equal has zero advantages: its answers teach nothing. IoU is 0 for every
answer that misses the true span, so a group of misses is such a group whatever the misses' distances;
``twass`` (:func:`video_grpo.rewards.span_sets.twass_score`) still ranks them. The rows:

- ``twass_flat_groups``: the share of groups whose rewards are all equal (max - min below ``FLAT_TOLERANCE``),
  the ``twass`` + ``iou`` sum against ``iou`` alone, on the **same** groups of answers: every group the
  benchmark's GRPO runs sampled (``ROLLOUT_RUNS``), re-scored with both reward sets after the run. Same answers,
  same policy, so the comparison is exact and costs no sampling. The reward of an answer is the sum of the
  named reward functions with weight 1, as TRL sums ``reward_funcs``. The ``format`` reward is left out of both
  sides (the trainers sum it too): a group whose answers all miss but one of which breaks the format is not flat
  under ``iou`` + ``format``, which would hide misses IoU cannot rank; the row reports the shares with it
  included as well (``flat_with_format``).
- ``twass_within_group_std``: on the same groups, the mean over groups of the population std of the G rewards,
  the same two sums. Adding a second reward in [0, 1] widens the range by itself: a copy of ``iou`` would give
  2x the std (4x the variance, the measure TimeLens2 reports, printed as ``variance_ratio``).
- ``twass_test_miou`` (``--seeds`` only): test mIoU after the same GRPO steps from the same cold start and
  trainer seed, ``iou`` + ``twass`` + ``format`` against ``iou`` + ``format``.

``twass`` here is the registry's: normalised by the merged true length (TimeLens2 since f07353b), read with our
parser (``twass_params``; its default reader takes TimeLens2's JSON answers only). ``bench learning`` emits the
first two rows over its own runs; it no longer trains a twass arm. ``python -m video_grpo.bench.twass_rows
--seeds 0 1 2`` runs the two GRPO arms alone for several trainer seeds from the benchmark's cold start, with the
benchmark's settings (``scale_rewards: group``, ``iou``); :mod:`video_grpo.bench.twass_evidence` asks the same
question with TimeLens2's settings, five seeds and two starts.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from video_grpo.rewards.answers import parse_answer_spans

# Re-scored groups: the GRPO runs that sample <think> answers to the task's single-span queries with the IoU
# reward, unguided (guided groups hold the true answer, not the policy's). The answer-only run is left out: it
# trains with iou_answer_only on another answer form, not with iou.
ROLLOUT_RUNS = ("ours", "plain", "curation_curated", "curation_whole")
WITH_TWASS = ("iou", "twass")  # TimeLens2 trains with twass1 + tiou (+ parse_penalty)
IOU_ALONE = ("iou",)
SCORED = ("iou", "twass", "format")  # every reward the rows sum
FLAT_TOLERANCE = 1e-9  # rewards of one group closer than this are equal (float sums of equal terms)


def twass_params(beta: float = 1.0) -> dict:
    """The twass arm's ``reward_kwargs``: the task answers ``<answer>S to E</answer>``, which twass's default reader
    (TimeLens2's JSON) scores 0, so it reads with ours; normalised by the true length (the default)."""
    return {"reader": "ours", "beta": beta}


def score_group(group: dict, names: tuple[str, ...] = SCORED) -> dict[str, list[float]]:
    """Each answer's reward under every registry reward of ``names``: one scoring per group and reward, however
    many sums are then made of them."""
    from video_grpo.rewards.functions import REWARD_FUNCS, SET_REWARDS

    columns = {"solution": group["solution"], "duration": group["duration"]}
    # TimeLens2's rewards read our "S to E" answers with our reader (theirs reads JSON only)
    readers = {name: {"reader": "ours"} for name in names if name in SET_REWARDS}
    return {
        name: REWARD_FUNCS[name](completions=group["completions"], **columns, **readers.get(name, {}))
        for name in names
    }


def summed_rewards(scores: dict[str, list[float]], names: tuple[str, ...]) -> list[float]:
    """Each answer's reward under the rewards ``names`` (:func:`score_group`), summed with weight 1 as TRL sums
    ``reward_funcs``."""
    return [sum(values) for values in zip(*(scores[name] for name in names), strict=True)]


def group_spread(scored: list[dict[str, list[float]]], names: tuple[str, ...]) -> dict:
    """Over the scored groups, summing ``names``: the number of flat groups, and the mean within-group
    population std and variance of the rewards (0 for no group)."""
    rewards = [summed_rewards(scores, names) for scores in scored]
    variances = [_population_variance(r) for r in rewards]
    count = max(len(rewards), 1)
    return {
        "flat": sum(max(r) - min(r) < FLAT_TOLERANCE for r in rewards),
        "std": sum(math.sqrt(v) for v in variances) / count,
        "variance": sum(variances) / count,
    }


def _population_variance(values: list[float]) -> float:
    """In floats: ``statistics.pvariance`` computes in exact fractions, seconds over a benchmark's groups."""
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def _share(count: int, total: int) -> float:
    return count / total if total else 0.0


def spread_rows(rollouts: dict[str, list[dict]], emit) -> dict:
    """``twass_flat_groups`` and ``twass_within_group_std`` over every group of ``rollouts`` (run name -> its
    recorded groups, :func:`video_grpo.bench.learning_runs.recording_rollouts`), with the counts of each run beside."""
    scored_by_run = {run: [score_group(group) for group in groups] for run, groups in rollouts.items()}
    scored = [scores for run in scored_by_run.values() for scores in run]
    total = len(scored)
    with_twass, alone = group_spread(scored, WITH_TWASS), group_spread(scored, IOU_ALONE)
    with_format = {
        "twass+iou+format": _share(group_spread(scored, (*WITH_TWASS, "format"))["flat"], total),
        "iou+format": _share(group_spread(scored, (*IOU_ALONE, "format"))["flat"], total),
    }
    by_run = {
        run: {
            "groups": len(run_scored),
            "flat_twass_iou": group_spread(run_scored, WITH_TWASS)["flat"],
            "flat_iou": group_spread(run_scored, IOU_ALONE)["flat"],
        }
        for run, run_scored in scored_by_run.items()
    }
    groups = [group for run in rollouts.values() for group in run]
    same_spans = sum(len({repr(parse_answer_spans(text)) for text in g["completions"]}) == 1 for g in groups)
    flat = emit(
        "twass_flat_groups",
        _share(with_twass["flat"], total),
        _share(alone["flat"], total),
        "share of GRPO groups whose G rewards are all equal, twass+iou vs iou alone, the same sampled answers",
        groups=total,
        flat_twass_iou=with_twass["flat"],
        flat_iou=alone["flat"],
        same_span_groups=same_spans,
        flat_with_format={k: round(v, 4) for k, v in with_format.items()},
        by_run=by_run,
        goal="ratio <= 0.25",
    )
    spread = emit(
        "twass_within_group_std",
        with_twass["std"],
        alone["std"],
        "mean within-group std of the GRPO reward, twass+iou vs iou alone, the same sampled answers",
        variance_twass_iou=round(with_twass["variance"], 6),
        variance_iou=round(alone["variance"], 6),
        variance_ratio=round(with_twass["variance"] / alone["variance"], 4) if alone["variance"] else None,
        groups=total,
        goal="ratio >= 2",
    )
    return {"twass_flat_groups": flat, "twass_within_group_std": spread}


def miou_row(
    emit, twass_after: dict, iou_after: dict, start: dict, steps: int, seed: int, beta: float = 1.0
) -> dict:
    """``twass_test_miou`` from the two arms' greedy test metrics (``learning_runs.test_metrics``)."""
    return emit(
        "twass_test_miou",
        twass_after["mIoU"],
        iou_after["mIoU"],
        "test mIoU % after the same GRPO steps from the same start: iou+twass+format vs iou+format",
        start_miou=round(start["mIoU"], 3),
        r1_05_twass=round(twass_after["R1@0.5"], 3),
        r1_05_iou=round(iou_after["R1@0.5"], 3),
        steps=steps,
        grpo_seed=seed,
        beta=beta,
        goal="report (ours > baseline hoped)",
    )


def seed_runs(work: Path, emit, seeds: list[int], steps: int | None = None, beta: float = 1.0) -> list[dict]:
    """For each trainer seed, the two arms from the benchmark's cold start (same task, seeds and SFT as
    ``bench learning``): the ``twass_test_miou`` row and the spread rows over both arms' groups. ``beta``: the
    twass arm's (the spread rows score with the registry's default, 1)."""
    import contextlib

    from video_grpo.bench import learning_runs as runs
    from video_grpo.toys.synthetic import make_flash_split

    budget = runs.FULL
    steps = steps or budget.grpo_steps
    data, _, start = runs.cold_start(work, budget)
    make_flash_split(data, "test", budget.test, seed=11, task=budget.task)
    train, test = runs.task_dataset(data / "train.jsonl"), runs.task_dataset(data / "test.jsonl")
    results = []
    with contextlib.redirect_stdout(sys.stderr):
        start_metrics = runs.test_metrics(start, test)
    for seed in seeds:
        rollouts: dict[str, list[dict]] = {"ours": [], "twass": []}
        after = {}
        for arm, extra in (("ours", ()), ("twass", ("twass",))):
            with contextlib.redirect_stdout(sys.stderr):
                runs.grpo(
                    start,
                    train,
                    work / arm,
                    steps,
                    seed=seed,
                    rollouts=rollouts[arm],
                    extra_rewards=extra,
                    extra_reward_params={"twass": twass_params(beta)} if extra else None,
                )
                after[arm] = runs.test_metrics(work / arm, test)
        row = miou_row(emit, after["twass"], after["ours"], start_metrics, steps, seed, beta=beta)
        results.append(row)
        results.append(spread_rows(rollouts, emit))
    return results


def main() -> int:
    import argparse
    import os
    import tempfile

    import torch
    from transformers.utils import logging as hf_logging

    from video_grpo.bench import emit as json_lines

    parser = argparse.ArgumentParser(
        description="The twass rows alone: iou+format vs iou+twass+format GRPO from the learning benchmark's "
        "cold start, per trainer seed (about 1 minute a seed on 2 idle cores)."
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="GRPO trainer seeds")
    parser.add_argument("--steps", type=int, help="GRPO steps per arm (default: the benchmark's 80)")
    parser.add_argument(
        "--beta", type=float, default=1.0, help="the twass arm's beta (TimeLens2's recipe: 1)"
    )
    args = parser.parse_args()
    json_lines.emit_stream = os.fdopen(os.dup(1), "w")  # JSON lines only on stdout: every other print,
    os.dup2(2, 1)  # DeepSpeed's import-time warning and the trainers' logs included, goes to stderr
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        seed_runs(Path(tmp), json_lines.emit, args.seeds, args.steps, args.beta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
