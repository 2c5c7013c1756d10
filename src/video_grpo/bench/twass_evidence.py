"""Does TimeLens2's ``twass`` reward help GRPO on the learning benchmark's task, with TimeLens2's settings?
(issue 44, item 7; numbers in docs/learning.md.)

Two arms, paired by GRPO seed, from one SFT start, everything else identical (the learning benchmark's task,
model, 80 steps of 8 prompts x G = 8, temperature 0.4, lr 3e-4, beta 0), both with TimeLens2's settings:
``scale_rewards: none`` (advantages are reward minus group mean, not divided by the group's std) and ``twass``
normalised by the merged true length, beta 1:

- **A**: ``tiou`` + ``format``;
- **B**: ``tiou`` + ``twass`` + ``format``.

``tiou`` and ``twass`` read the task's ``<answer>S to E</answer>`` with ``reader: ours`` (their default reads
TimeLens2's JSON answers only and would score every answer here 0). The settings are fixed in this module
(``ARMS``, ``REWARD_PARAMS``, ``CONFIG``, ``SEEDS``, ``STARTS``) and were fixed before any arm's result was seen.

Two starts (``STARTS``): ``normal``, the learning benchmark's cold start (100 SFT steps), and ``hard``, a shorter
SFT of the same model on the same videos (``HARD_SFT_STEPS``). The hard start was chosen with ``starts`` (no GRPO
run, no arm's result seen), by a rule fixed beforehand: the longest SFT of those measured (30-100 steps) whose 8
sampled answers per training query miss entirely (IoU 0 in all 8) and are still ranked by ``twass`` (two parsed
answers at least) for at least 15% of the queries, so that at least 10% of GRPO's first groups miss entirely.
That is 40 steps (15.6%; 50-100 steps: 0-9.4%). It is a weak start: it writes the answer format in about a
quarter of its sampled answers and scores 0.9% greedy test mIoU; the 50-90-step SFTs answer mostly one stock
span whatever the video (docs/learning.md).

Rows (JSON lines, :mod:`video_grpo.bench.emit`), per start:

- ``twass_start``: the start's test mIoU and the share of all-miss groups: at the start (8 answers per training
  query at the GRPO temperature), in the first GRPO step of each arm (8 groups x 5 seeds) and over each run;
- ``twass_paired_miou``: test mIoU (greedy, 160 test queries), B vs A, means over seeds; the paired mean
  difference B - A with its 95% t-interval over the per-seed differences;
- ``twass_answer_length``: mean length (s) of the greedy test answers, B vs A, beside the true mean length;
- ``twass_flat_own`` / ``twass_variance_own``: on each arm's **own** sampled groups, scored with the reward it
  trained with (the sum of its reward functions, weight 1, as TRL sums them): the share of flat groups (max - min
  below 1e-9) and the mean within-group population variance, B vs A;
- ``twass_flat_rescored`` / ``twass_variance_rescored``: on the **same** groups (every group both arms sampled),
  scored with B's reward and with A's;
- ``gt_guidance_gain``: the learning benchmark's definition (mean accuracy reward of the policy's own answers over
  the last 20% of steps, ground-truth-guided groups with TempSamp shaping vs unguided), with arm A's rewards and
  settings, per seed against arm A's run of that seed.

``python -m video_grpo.bench.twass_evidence`` runs it all (both starts, 5 seeds, both arms, the guided runs);
``python -m video_grpo.bench.twass_evidence starts --sft_steps 30 40 50`` measures candidate starts only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sys
import time
from pathlib import Path

from video_grpo.bench import learning_runs as runs

ARMS: dict[str, tuple[str, ...]] = {"A": ("tiou", "format"), "B": ("tiou", "twass", "format")}
REWARD_PARAMS: dict[str, dict] = {
    "tiou": {"reader": "ours"},
    "twass": {"reader": "ours", "beta": 1.0, "normalizer": "truth"},
}
CONFIG = {"scale_rewards": "none"}  # TimeLens2's: advantages are not divided by the group's std
SEEDS = (0, 1, 2, 3, 4)
HARD_SFT_STEPS = 40  # chosen by ``starts`` (docs/learning.md): see the module docstring
STARTS = {"normal": runs.FULL.sft_steps, "hard": HARD_SFT_STEPS}
START_SAMPLES = 8  # answers per training query when measuring a start's all-miss groups (G)
HARD_MISS_SHARE = (
    0.15  # a hard start's share of all-miss groups twass ranks, at the start, over training queries
)
FLAT_TOLERANCE = 1e-9  # a group's rewards closer than this are equal
# Two-sided 95% Student t quantiles (0.975) by degrees of freedom; the interval over n seeds uses n - 1.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


# -- scoring -------------------------------------------------------------------------------------------------


SCORED = ("tiou", "twass", "format")  # every reward the arms sum


@functools.cache
def _scoring_funcs() -> tuple:
    from video_grpo.rewards.functions import resolve_reward_funcs

    return tuple(resolve_reward_funcs(list(SCORED), REWARD_PARAMS))


def score_group(group: dict) -> dict[str, list[float]]:
    """Each answer's value under ``tiou``, ``twass`` and ``format`` with the arms' parameters: one scoring per
    reward, whatever sums are then made of them."""
    columns = {"solution": group["solution"], "duration": group["duration"]}
    return {
        name: func(completions=group["completions"], **columns)
        for name, func in zip(SCORED, _scoring_funcs(), strict=True)
    }


def summed(scores: dict[str, list[float]], names: tuple[str, ...]) -> list[float]:
    """The arm's reward per answer: its reward functions summed with weight 1, as TRL sums them."""
    return [sum(values) for values in zip(*(scores[name] for name in names), strict=True)]


def population_variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def spread(scored: list[dict[str, list[float]]], names: tuple[str, ...]) -> dict:
    """Over groups, with the reward ``names``: how many are flat, and the mean within-group variance (what the
    advantages' size follows under ``scale_rewards: none``) and std."""
    rewards = [summed(scores, names) for scores in scored]
    variances = [population_variance(r) for r in rewards]
    count = max(len(rewards), 1)
    return {
        "groups": len(rewards),
        "flat": sum(max(r) - min(r) < FLAT_TOLERANCE for r in rewards),
        "flat_share": sum(max(r) - min(r) < FLAT_TOLERANCE for r in rewards) / count,
        "variance": sum(variances) / count,
        "std": sum(math.sqrt(v) for v in variances) / count,
    }


def all_miss(scores: dict[str, list[float]]) -> bool:
    """A group whose every answer has IoU 0 (``tiou``): IoU cannot rank its answers."""
    return all(value == 0.0 for value in scores["tiou"])


def paired_interval(ours: list[float], baseline: list[float]) -> dict:
    """Mean of the paired differences ``ours - baseline`` and its two-sided 95% Student t-interval (n - 1 degrees of
    freedom; the sample std of the differences)."""
    diffs = [a - b for a, b in zip(ours, baseline, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n, "diffs": diffs}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = T975[n - 1] * sd / math.sqrt(n)
    return {
        "mean": mean,
        "low": mean - half,
        "high": mean + half,
        "sd": sd,
        "t": T975[n - 1],
        "n": n,
        "diffs": diffs,
    }


def span_length(output: str | None) -> float | None:
    """Seconds covered by an answer's spans (merged; as ``tiou`` reads it); None when it gives none."""
    from video_grpo.rewards.answers import parse_answer_spans
    from video_grpo.rewards.span_sets import total_length

    spans = parse_answer_spans(output) if output is not None else None
    return total_length(spans) if spans else None


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# -- the runs (each in a worker process; results are JSON files, so an interrupted run resumes) -----------------


def _setup() -> None:
    from video_grpo.bench.learning import _worker_setup

    _worker_setup()


def _cached(path: Path, make):
    """``make()``'s JSON result, kept in ``path``: a rerun with the same ``--work_dir`` does not repeat it."""
    if path.exists():
        return json.loads(path.read_text())
    result = make()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    return result


def _start(work: Path, steps: int) -> str:
    """The SFT start of ``steps`` steps (the learning benchmark's cold start for 100), from the same tiny model and
    videos."""
    out = work / f"sft_{steps}"
    if not (out / "config.json").exists():
        with contextlib.redirect_stdout(sys.stderr):
            runs.sft(work / "tiny", runs.task_dataset(work / "task" / "train.jsonl"), out, steps)
    return str(out)


def _start_stats(work: Path, steps: int) -> dict:
    """A start's greedy test metrics and its sampled groups' all-miss share (``START_SAMPLES`` answers per training
    query at the GRPO temperature, scored as the arms score them), and the share of all-miss groups whose answers
    ``twass`` ranks (not all the same value: at least two distinct parsed spans)."""
    import torch

    def make() -> dict:
        start = Path(_start(work, steps))
        torch.manual_seed(0)
        with contextlib.redirect_stdout(sys.stderr):
            test = runs.test_metrics(start, runs.task_dataset(work / "task" / "test.jsonl"))
            records = runs.answers(
                start,
                runs.task_dataset(work / "task" / "train.jsonl"),
                do_sample=True,
                temperature=runs.GRPO_SETTINGS["temperature"],
                repeats=START_SAMPLES,
            )
        by_query: dict[str, dict] = {}
        for record in records:
            group = by_query.setdefault(record["id"], {"completions": [], "solution": [], "duration": []})
            group["completions"].append(record["output"] or "")
            group["solution"].append(record["solution"])
            group["duration"].append(record["duration"])
        scored = [score_group(group) for group in by_query.values()]
        misses = [scores for scores in scored if all_miss(scores)]
        ranked = [scores for scores in misses if len(set(scores["twass"])) > 1]  # twass ranks its answers
        return {
            "sft_steps": steps,
            "test_miou": test["mIoU"],
            "test_r1_05": test["R1@0.5"],
            "test_parsed": test["parsed"],
            "sampled_miou": 100 * mean([v for scores in scored for v in scores["tiou"]]),
            "sampled_format": mean([v for scores in scored for v in scores["format"]]),
            "queries": len(scored),
            "all_miss_queries": len(misses),
            "all_miss_share": len(misses) / len(scored),
            "ranked_all_miss_share": len(ranked) / len(scored),
        }

    return _cached(work / f"start_{steps}.json", make)


def _arm(work: Path, steps: int, seed: int, arm: str, grpo_steps: int) -> dict:
    """One arm's GRPO run from a start: its log, its sampled groups, and its greedy test answers."""
    from video_grpo.rewards.functions import resolve_reward_funcs

    def make() -> dict:
        start = Path(_start(work, steps))
        names = ARMS[arm]
        accuracy, *extra = resolve_reward_funcs(
            [n for n in names if n != "format"], {n: p for n, p in REWARD_PARAMS.items() if n in names}
        )
        out = work / f"run_{steps}_{seed}_{arm}"
        rollouts: list[dict] = []
        with contextlib.redirect_stdout(sys.stderr):
            history = runs.grpo(
                start,
                runs.task_dataset(work / "task" / "train.jsonl"),
                out,
                grpo_steps,
                seed=seed,
                rollouts=rollouts,
                accuracy_reward=accuracy,
                extra_rewards=tuple(n for n in names if n not in ("tiou", "format")),
                extra_reward_params={"twass": REWARD_PARAMS["twass"]} if "twass" in names else None,
                config=CONFIG,
            )
            test = runs.test_metrics(out, runs.task_dataset(work / "task" / "test.jsonl"))
        return {
            "history": history,
            "rollouts": rollouts,
            "test": {k: v for k, v in test.items() if k != "records"},
            "answers": [{"output": r["output"], "solution": r["solution"]} for r in test["records"]],
        }

    return _cached(work / f"run_{steps}_{seed}_{arm}_{grpo_steps}.json", make)


def _guided(work: Path, steps: int, seed: int, grpo_steps: int) -> dict:
    """Arm A's run with ground-truth-guided groups and TempSamp shaping (the learning benchmark's guided run)."""
    from video_grpo.rewards.functions import resolve_reward_funcs

    def make() -> dict:
        (accuracy,) = resolve_reward_funcs(["tiou"], {"tiou": REWARD_PARAMS["tiou"]})
        with contextlib.redirect_stdout(sys.stderr):
            history = runs.grpo(
                Path(_start(work, steps)),
                runs.task_dataset(work / "task" / "train.jsonl"),
                work / f"guided_{steps}_{seed}",
                grpo_steps,
                save=False,
                seed=seed,
                accuracy_reward=accuracy,
                config=CONFIG,
                gt_guidance=True,
                advantage_shaping="tempsamp",
                answer_template=runs.ANSWER_TEMPLATE,
            )
        return {"history": history}

    return _cached(work / f"guided_{steps}_{seed}_{grpo_steps}.json", make)


def prepare(work: Path) -> None:
    """The learning benchmark's task (training seed 10, test seed 11), tiny model and frame cache, in ``work``."""
    from video_grpo.toys.synthetic import make_flash_split
    from video_grpo.toys.tiny import build_tiny_model

    budget = runs.FULL
    make_flash_split(work / "task", "train", budget.train, seed=10, task=budget.task)
    make_flash_split(work / "task", "test", budget.test, seed=11, task=budget.task)
    if not (work / "tiny" / "config.json").exists():
        build_tiny_model(work / "tiny", **runs.MODEL_SIZE)
    runs.task_dataset(work / "task" / "train.jsonl"), runs.task_dataset(work / "task" / "test.jsonl")


def _pool(workers: int):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_setup)


def measure_starts(work: Path, sft_steps: list[int], emit, workers: int = 2) -> list[dict]:
    """``twass_candidate_start`` per SFT length: test mIoU and the all-miss share at the start (how the hard start
    was chosen; no GRPO run)."""
    prepare(work)
    with _pool(workers) as pool:
        stats = [job.result() for job in [pool.submit(_start_stats, work, n) for n in sft_steps]]
    return [
        emit(
            "twass_candidate_start",
            s["ranked_all_miss_share"],
            HARD_MISS_SHARE,
            "share of training queries whose 8 sampled answers all have IoU 0 and twass ranks, vs the hard bar",
            **s,
        )
        for s in stats
    ]


# -- the rows ------------------------------------------------------------------------------------------------


def start_rows(name: str, stats: dict, arms: dict[tuple[int, str], dict], scored: dict, emit) -> dict:
    """Every row of one start (see the module docstring) from its runs: ``arms`` (seed, arm) -> the run's result,
    ``scored`` the same keys -> its groups scored by :func:`score_group`."""
    from video_grpo.bench.learning import series

    rows = {}
    per_step = runs.GRPO_SETTINGS["per_device_train_batch_size"] // runs.GRPO_SETTINGS["num_generations"]
    first = {arm: [s for seed in SEEDS for s in scored[seed, arm][:per_step]] for arm in ARMS}
    whole = {arm: [s for seed in SEEDS for s in scored[seed, arm]] for arm in ARMS}
    last = {
        arm: [s for seed in SEEDS for s in scored[seed, arm][-len(scored[seed, arm]) // 5 :]] for arm in ARMS
    }

    def share(groups: list[dict]) -> float:
        return sum(map(all_miss, groups)) / len(groups)

    rows["start"] = emit(
        "twass_start",
        share(first["A"]),
        HARD_MISS_SHARE if name == "hard" else None,
        "share of GRPO groups whose every answer has IoU 0: arm A's first step (8 groups x seeds)",
        start=name,
        sft_steps=stats["sft_steps"],
        start_test_miou=round(stats["test_miou"], 3),
        start_all_miss_share=round(stats["all_miss_share"], 4),
        start_ranked_all_miss_share=round(stats["ranked_all_miss_share"], 4),
        first_step_all_miss={arm: round(share(first[arm]), 4) for arm in ARMS},
        run_all_miss={arm: round(share(whole[arm]), 4) for arm in ARMS},
        last_fifth_all_miss={arm: round(share(last[arm]), 4) for arm in ARMS},
        groups_per_run=len(scored[SEEDS[0], "A"]),
    )
    miou = {arm: [arms[seed, arm]["test"]["mIoU"] for seed in SEEDS] for arm in ARMS}
    interval = paired_interval(miou["B"], miou["A"])
    goal = "paired mean >= 0" if name == "hard" else "paired mean >= -1 point"
    rows["miou"] = emit(
        "twass_paired_miou",
        mean(miou["B"]),
        mean(miou["A"]),
        "test mIoU % after GRPO, B (tiou+twass+format) vs A (tiou+format), mean over paired seeds",
        start=name,
        start_test_miou=round(stats["test_miou"], 3),
        seeds=list(SEEDS),
        miou_a=[round(v, 3) for v in miou["A"]],
        miou_b=[round(v, 3) for v in miou["B"]],
        paired_diff=round(interval["mean"], 3),
        ci95=[round(interval["low"], 3), round(interval["high"], 3)] if interval["low"] is not None else None,
        interval="two-sided 95% Student t over the per-seed differences B - A",
        diffs=[round(d, 3) for d in interval["diffs"]],
        b_better=sum(d > 0 for d in interval["diffs"]),
        r1_05_a=round(mean([arms[s, "A"]["test"]["R1@0.5"] for s in SEEDS]), 3),
        r1_05_b=round(mean([arms[s, "B"]["test"]["R1@0.5"] for s in SEEDS]), 3),
        format_a=round(mean([arms[s, "A"]["test"]["format"] for s in SEEDS]), 3),
        format_b=round(mean([arms[s, "B"]["test"]["format"] for s in SEEDS]), 3),
        goal=goal,
    )
    lengths = {
        arm: [
            mean(
                [x for x in map(span_length, (a["output"] for a in arms[s, arm]["answers"])) if x is not None]
            )
            for s in SEEDS
        ]
        for arm in ARMS
    }
    answers = arms[SEEDS[0], "A"]["answers"]
    true_length = mean([float(a["solution"][1]) - float(a["solution"][0]) for a in answers])
    sampled_last = {
        arm: mean(
            [
                x
                for s in SEEDS
                for group in arms[s, arm]["rollouts"][-len(arms[s, arm]["rollouts"]) // 5 :]
                for x in map(span_length, group["completions"])
                if x is not None
            ]
        )
        for arm in ARMS
    }
    rows["length"] = emit(
        "twass_answer_length",
        mean(lengths["B"]),
        mean(lengths["A"]),
        "mean length (s) of the greedy test answers, B vs A, over seeds",
        start=name,
        true_length=round(true_length, 4),
        per_seed_a=[round(v, 3) for v in lengths["A"]],
        per_seed_b=[round(v, 3) for v in lengths["B"]],
        sampled_last_fifth={arm: round(v, 3) for arm, v in sampled_last.items()},
    )
    own = {arm: spread(whole[arm], ARMS[arm]) for arm in ARMS}
    own_no_format = {arm: spread(whole[arm], tuple(n for n in ARMS[arm] if n != "format")) for arm in ARMS}
    trl_zero_std = {
        arm: mean([v for s in SEEDS for v in series(arms[s, arm]["history"], "frac_reward_zero_std")])
        for arm in ARMS
    }
    rows["flat_own"] = emit(
        "twass_flat_own",
        own["B"]["flat_share"],
        own["A"]["flat_share"],
        "share of flat groups on each arm's own sampled groups, scored with its own training reward, B vs A",
        start=name,
        groups=own["A"]["groups"],
        flat={arm: own[arm]["flat"] for arm in ARMS},
        trl_frac_reward_zero_std={arm: round(v, 4) for arm, v in trl_zero_std.items()},
        without_format={arm: round(own_no_format[arm]["flat_share"], 4) for arm in ARMS},
        goal="ratio <= 0.3 (TimeLens2: 3.6% vs 13.8%)",
    )
    rows["variance_own"] = emit(
        "twass_variance_own",
        own["B"]["variance"],
        own["A"]["variance"],
        "mean within-group reward variance on each arm's own sampled groups, own training reward, B vs A",
        start=name,
        std={arm: round(own[arm]["std"], 6) for arm in ARMS},
        without_format={arm: round(own_no_format[arm]["variance"], 6) for arm in ARMS},
        goal="ratio >= 3 (TimeLens2: 4.0x)",
    )
    both = whole["A"] + whole["B"]
    rescored = {arm: spread(both, ARMS[arm]) for arm in ARMS}
    by_origin = {origin: {arm: spread(whole[origin], ARMS[arm]) for arm in ARMS} for origin in ARMS}
    rows["flat_rescored"] = emit(
        "twass_flat_rescored",
        rescored["B"]["flat_share"],
        rescored["A"]["flat_share"],
        "share of flat groups on the same groups (both arms' sampled groups), B's reward vs A's",
        start=name,
        groups=rescored["A"]["groups"],
        flat={arm: rescored[arm]["flat"] for arm in ARMS},
        by_origin={
            f"{origin}_groups": {arm: by_origin[origin][arm]["flat"] for arm in ARMS} for origin in ARMS
        },
        goal="ratio <= 0.3",
    )
    rows["variance_rescored"] = emit(
        "twass_variance_rescored",
        rescored["B"]["variance"],
        rescored["A"]["variance"],
        "mean within-group reward variance on the same groups, B's reward vs A's",
        start=name,
        std={arm: round(rescored[arm]["std"], 6) for arm in ARMS},
        by_origin={
            f"{origin}_groups": {arm: round(by_origin[origin][arm]["variance"], 6) for arm in ARMS}
            for origin in ARMS
        },
        goal="ratio >= 3",
    )
    return rows


def guidance_row(name: str, arms: dict, guided: dict, emit) -> dict:
    """``gt_guidance_gain`` as the learning benchmark defines it, per seed against arm A, and over the seeds."""
    from video_grpo.bench.learning import fifth_means, series

    sampled, unguided = [], []
    for seed in SEEDS:
        values = series(guided[seed]["history"], "guidance/sampled_accuracy_reward")
        sampled.append(fifth_means(values)[1])
        base = series(arms[seed, "A"]["history"][: len(values)], "rewards/tiou_reward/mean")
        unguided.append(fifth_means(base)[1])
    return emit(
        "gt_guidance_gain",
        mean(sampled),
        mean(unguided),
        "mean tIoU reward of sampled answers, last 20% of steps: guided+tempsamp vs unguided (arm A), mean over seeds",
        start=name,
        per_seed_guided=[round(v, 4) for v in sampled],
        per_seed_unguided=[round(v, 4) for v in unguided],
        per_seed_ratio=[round(g / u, 4) if u else None for g, u in zip(sampled, unguided, strict=True)],
        steps=len(series(guided[SEEDS[0]]["history"], "guidance/sampled_accuracy_reward")),
        goal="ratio > 1",
    )


def run(work: Path, emit, workers: int = 2, grpo_steps: int | None = None, guidance: bool = True) -> dict:
    """Every run of both starts in ``workers`` processes (each run's numbers are what it gives alone: its seeds are
    its own), then the rows."""
    started = time.perf_counter()
    grpo_steps = grpo_steps or runs.FULL.grpo_steps
    prepare(work)
    with _pool(workers) as pool:
        for job in [pool.submit(_start, work, n) for n in STARTS.values()]:
            job.result()
        stats_jobs = {name: pool.submit(_start_stats, work, n) for name, n in STARTS.items()}
        arm_jobs = {
            (name, seed, arm): pool.submit(_arm, work, n, seed, arm, grpo_steps)
            for name, n in STARTS.items()
            for seed in SEEDS
            for arm in ARMS
        }
        guided_jobs = (
            {
                (name, seed): pool.submit(_guided, work, n, seed, grpo_steps)
                for name, n in STARTS.items()
                for seed in SEEDS
            }
            if guidance
            else {}
        )
        stats = {name: job.result() for name, job in stats_jobs.items()}
        done = {key: job.result() for key, job in arm_jobs.items()}
        guided = {key: job.result() for key, job in guided_jobs.items()}
    results = {}
    for name in STARTS:
        arms = {(seed, arm): done[name, seed, arm] for seed in SEEDS for arm in ARMS}
        scored = {key: [score_group(g) for g in run_["rollouts"]] for key, run_ in arms.items()}
        results[name] = start_rows(name, stats[name], arms, scored, emit)
        if guidance:
            results[name]["guidance"] = guidance_row(name, arms, {s: guided[name, s] for s in SEEDS}, emit)
    emit("twass_evidence_wall_time", time.perf_counter() - started, None, "s, the whole command")
    return results


def main() -> int:
    import argparse
    import os
    import tempfile

    import torch
    from transformers.utils import logging as hf_logging

    from video_grpo.bench import emit as json_lines

    parser = argparse.ArgumentParser(
        description="twass with TimeLens2's settings on the learning benchmark's task: A (tiou+format) vs B "
        "(tiou+twass+format), 5 paired GRPO seeds from a normal and a hard SFT start, plus guided runs. "
        "'starts': candidate starts' all-miss shares only."
    )
    parser.add_argument("command", nargs="?", default="run", choices=["run", "starts"])
    parser.add_argument(
        "--work_dir", help="keep every run's result here; a rerun resumes (default: a temp dir)"
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="processes the runs share (the rows do not depend on it)"
    )
    parser.add_argument(
        "--sft_steps", type=int, nargs="+", default=[30, 50, 70, 100], help="starts: SFT lengths"
    )
    parser.add_argument(
        "--steps", type=int, help="GRPO steps per run (default: the benchmark's 80; a smoke run)"
    )
    parser.add_argument("--no_guidance", action="store_true", help="skip the guided runs")
    args = parser.parse_args()
    json_lines.emit_stream = os.fdopen(
        os.dup(1), "w"
    )  # JSON lines only on stdout; every other print to stderr
    os.dup2(2, 1)
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with contextlib.ExitStack() as stack:
        work = Path(args.work_dir or stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        if args.command == "starts":
            measure_starts(work, args.sft_steps, json_lines.emit, args.workers)
        else:
            run(work, json_lines.emit, args.workers, args.steps, guidance=not args.no_guidance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
