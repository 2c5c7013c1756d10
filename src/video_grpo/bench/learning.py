"""Does GRPO teach the model to look at the video? A side-by-side learning benchmark on CPU.

Run through ``python -m video_grpo.bench learning [--quick]`` (numbers and curves: docs/learning.md). The task
(:class:`video_grpo.toys.synthetic.FlashTask`): 16-s videos in which the screen's upper half turns a named colour
between S and E, anywhere in the video; the lower half shows a clock. No fixed answer scores well
(``best_fixed_span_miou``). A tiny Qwen2.5-VL gets a short SFT cold start, then every comparison starts from
that one checkpoint with the same data, rewards (``iou`` + ``format``), hyperparameters and step budget.
Reported (JSON lines, the benchmark schema):

- ``uses_video``: test mIoU of the GRPO model with the real frames vs every frame blacked out;
- ``vs_plain_trl``: test-mIoU gain over the start, ``VideoGRPOTrainer`` vs TRL's ``GRPOTrainer`` fed the frames in
  the prompt (its generation sees them, its loss does not); ratio = ours / max(plain's gain, 1 point);
- ``learning_iou``: mean IoU reward, last 20% vs first 20% of our GRPO steps;
- ``test_iou_before_after``: test mIoU after vs before GRPO; ``best_fixed_span_miou``: GRPO model vs the one
  span that scores best on the training set;
- ``gt_guidance_gain``: mean IoU reward of the policy's own answers over the last 20% of steps, with
  ground-truth-guided groups and TempSamp shaping vs without;
- ``answer_only``: TimeLens's setting on the same task: a cold start taught ``The event happens in S - E
  seconds.`` (same videos, model and SFT steps), then the same GRPO steps with the IoU reward alone; test mIoU
  after vs before, beside the ``<think>`` setting's, and the tokens decoded per step in each (TRL's
  ``completions/mean_length`` x the 64 answers of a step);
- ``curation_signal``: the mean within-group std of the IoU reward, training on the curated vs the whole of a pool
  with a spread of difficulty, for the same steps (:mod:`video_grpo.bench.curation`);
- ``twass_flat_groups``, ``twass_within_group_std``: the share of flat groups and the within-group reward std,
  ``twass`` + ``iou`` vs ``iou`` alone, on the same sampled groups of the runs above
  (:mod:`video_grpo.bench.twass_rows`). Whether training with ``twass`` answers better is
  :mod:`video_grpo.bench.twass_evidence`'s question (several seeds, two starts), not this run's.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

from video_grpo.bench import learning_runs as runs
from video_grpo.bench.emit import emit_row
from video_grpo.bench.fork_server import reaped_fork_server
from video_grpo.bench.learning_runs import FULL, QUICK, SUITE, cold_start


def fifth_means(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last 20% of ``values``."""
    fifth = max(1, len(values) // 5)
    return sum(values[:fifth]) / fifth, sum(values[-fifth:]) / fifth


def series(history: list[dict], key: str) -> list[float]:
    return [float(e[key]) for e in history if key in e]


def _worker_setup() -> None:
    """A benchmark worker: trainer logs go to stderr (stdout carries the JSON lines), transformers quiet, one
    thread, so that two workers run two threads on two cores, not four. The thread count does not change the
    numbers: 6 SFT and 2 GRPO steps gave the same weights and logs to the bit with 1 and 2 threads, and the full
    run with two workers gave every row of docs/learning.md unchanged."""
    import os

    import torch
    from transformers.utils import logging as hf_logging

    os.dup2(2, 1)
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()


# What every worker imports: a forkserver imports them once and forks each worker from it (about 10 CPU s of
# imports per process on this machine), where spawn imported them again in every worker. The server forks before
# any computation, from one thread; every run seeds itself (the trainers' ``seed``), so the rows are spawn's.
WORKER_MODULES = (
    "video_grpo.bench.learning",
    "video_grpo.bench.curation",
    "video_grpo.trainer",
    "video_grpo.sft",
    "video_grpo.evaluate",
    "video_grpo.curate",
    "trl",
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    "transformers.models.qwen2_5_vl.processing_qwen2_5_vl",
    "transformers.models.qwen2_vl.video_processing_qwen2_vl",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl",
)


def _sft_start(work: Path, data: Path, budget, answer_only: bool) -> Path:
    """The cold start (``answer_only``: TimeLens's sentence instead of the ``<think>`` answer)."""
    if answer_only:
        return runs.answer_only_start(work, data, budget)
    with contextlib.redirect_stdout(sys.stderr):
        return runs.sft(
            work / "tiny", runs.task_dataset(data / "train.jsonl"), work / "sft", budget.sft_steps
        )


def _ours(work: Path, data: Path, start: Path, steps: int) -> dict:
    """VideoGRPOTrainer from the cold start, and the test metrics before and after, with real and black frames;
    its sampled groups (``rollouts``) for the twass rows."""
    train, test = runs.task_dataset(data / "train.jsonl"), runs.task_dataset(data / "test.jsonl")
    rollouts: list[dict] = []
    with contextlib.redirect_stdout(sys.stderr):
        return {
            "before": runs.test_metrics(start, test),
            "before_blank": runs.test_metrics(start, runs.with_transform(test, runs.BlankFrames)),
            "ours": runs.grpo(start, train, work / "ours", steps, rollouts=rollouts),
            "after": runs.test_metrics(work / "ours", test),
            "blank": runs.test_metrics(work / "ours", runs.with_transform(test, runs.BlankFrames)),
            "rollouts": rollouts,
        }


def _plain(work: Path, data: Path, start: Path, steps: int) -> dict:
    """TRL's own GRPOTrainer from the same start, with the same budget, and its test metrics after."""
    train, test = runs.task_dataset(data / "train.jsonl"), runs.task_dataset(data / "test.jsonl")
    rollouts: list[dict] = []
    with contextlib.redirect_stdout(sys.stderr):
        history = runs.grpo(start, train, work / "plain", steps, plain=True, rollouts=rollouts)
        return {
            "plain": history,
            "plain_after": runs.test_metrics(work / "plain", test),
            "rollouts": rollouts,
        }


def _guided(work: Path, data: Path, start: Path, steps: int) -> list[dict]:
    """Ground-truth-guided groups with TempSamp shaping from the same start."""
    with contextlib.redirect_stdout(sys.stderr):
        return runs.grpo(
            start,
            runs.task_dataset(data / "train.jsonl"),
            work / "guided",
            steps,
            save=False,
            gt_guidance=True,
            advantage_shaping="tempsamp",
            answer_template=runs.ANSWER_TEMPLATE,
        )


def _curation(work: Path, data: Path, train_records: list[dict], task, start: Path) -> dict:
    from video_grpo.bench.curation import run_curation
    from video_grpo.bench.emit import row as json_row

    test = runs.task_dataset(data / "test.jsonl")
    rollouts: dict[str, list[dict]] = {}
    row = run_curation(work, data, train_records, task, start, test, json_row, rollouts=rollouts)
    return {"row": row, "rollouts": rollouts}


def run(
    work: Path,
    emit,
    plot_to: Path | None = None,
    quick: bool = False,
    workers: int = 2,
    suite: bool = False,
) -> dict:
    """The benchmark. Every run starts from files, so its independent parts (the two cold starts, then ours, plain
    TRL, guided, answer-only and curation) run in ``workers`` processes side by side; each part's numbers are what
    it gives alone (its seeds are its own), so ``workers`` changes the wall time, not the rows. ``suite``: the
    ``SUITE`` budget (``tests/test_learning.py``): the same runs less the guided and answer-only ones, whose rows
    (``gt_guidance_gain``, ``answer_only``) it does not emit; every other row is the full run's."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from video_grpo.bench.learning_plots import plot_learning
    from video_grpo.toys.synthetic import best_fixed_span, make_flash_split, temporal_iou
    from video_grpo.toys.tiny import build_tiny_model

    budget = QUICK if quick else SUITE if suite else FULL
    started = time.perf_counter()
    data = work / "task"
    train_records = make_flash_split(data, "train", budget.train, seed=10, task=budget.task)
    test_records = make_flash_split(data, "test", budget.test, seed=11, task=budget.task)
    build_tiny_model(work / "tiny", **runs.MODEL_SIZE)
    runs.task_dataset(data / "train.jsonl"), runs.task_dataset(data / "test.jsonl")  # the frame cache, once
    fixed = best_fixed_span(train_records)
    fixed_miou = (
        100 * sum(temporal_iou(fixed, tuple(r["solution"])) for r in test_records) / len(test_records)
    )
    steps = budget.grpo_steps
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_MODULES))
    with (
        reaped_fork_server(),  # its and its workers' CPU stays in this process tree's
        ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_setup) as pool,
    ):
        start_job = pool.submit(_sft_start, work, data, budget, False)
        if budget.answer_only:
            answer_only_start_job = pool.submit(_sft_start, work, data, budget, True)
        start = start_job.result()
        if budget.answer_only:
            answer_only_start_job.result()
        jobs = {}  # the longest first, so that the last to finish is short
        if not budget.answer_only:
            # Plain TRL's run is the longest part (147 CPU s against 89 for ours and 88 for curation, measured on
            # 6 December): alone on one worker while the other runs curation then ours (177 CPU s), the two workers
            # end about half a minute apart instead of plain TRL starting last.
            # The full run's order below pairs its five parts about evenly as it is (236 and 237 CPU s).
            jobs["plain"] = pool.submit(_plain, work, data, start, steps)
        if budget.curate:
            jobs["curation"] = pool.submit(_curation, work, data, train_records, budget.task, start)
        jobs["ours"] = pool.submit(_ours, work, data, start, steps)
        if budget.answer_only:
            jobs["answer_only"] = pool.submit(answer_only_runs, work, data, steps)
            jobs["plain"] = pool.submit(_plain, work, data, start, steps)
        if budget.guided_steps:
            jobs["guided"] = pool.submit(_guided, work, data, start, budget.guided_steps)
        done = {name: job.result() for name, job in jobs.items()}
    before, before_blank, ours = done["ours"]["before"], done["ours"]["before_blank"], done["ours"]["ours"]
    after, blank = done["ours"]["after"], done["ours"]["blank"]
    plain, plain_after = done["plain"]["plain"], done["plain"]["plain_after"]
    guided = done.get("guided", [])
    if budget.answer_only:
        answer_only = answer_only_row(done["answer_only"], emit, before, after, ours)
    ious = series(ours, "rewards/iou_reward/mean")
    first, last = fifth_means(ious)
    ours_gain, plain_gain = after["mIoU"] - before["mIoU"], plain_after["mIoU"] - before["mIoU"]
    queries = {"queries": len(test_records), "spans": "slots" if budget.task.slots else "continuous"}
    results = {
        "uses_video": emit(
            "uses_video",
            after["mIoU"],
            blank["mIoU"],
            "test mIoU % of the GRPO model, real frames vs every frame blacked out",
            start_miou=round(before["mIoU"], 3),
            start_blank_miou=round(before_blank["mIoU"], 3),
            goal="ratio >= 2",
            **queries,
        ),
        "vs_plain_trl": emit(
            "vs_plain_trl",
            ours_gain,
            max(plain_gain, 1.0),
            "test-mIoU gain (points) from the same start, VideoGRPOTrainer vs max(TRL GRPOTrainer, 1)",
            plain_gain=round(plain_gain, 3),
            start_miou=round(before["mIoU"], 3),
            plain_miou=round(plain_after["mIoU"], 3),
            steps=steps,
            goal="ratio >= 2",
        ),
        "learning_iou": emit(
            "learning_iou",
            last,
            first,
            "mean IoU reward (last 20% vs first 20% of GRPO steps)",
            steps=len(ious),
            goal="ratio >= 2",
        ),
        "test_iou": emit(
            "test_iou_before_after",
            after["mIoU"],
            before["mIoU"],
            "test mIoU % (after vs before GRPO)",
            r1_05_after=round(after["R1@0.5"], 3),
            r1_05_before=round(before["R1@0.5"], 3),
            format_after=round(after["format"], 3),
            format_before=round(before["format"], 3),
            goal="ours > baseline",
            **queries,
        ),
        "best_fixed_span": emit(
            "best_fixed_span_miou",
            after["mIoU"],
            fixed_miou,
            "test mIoU %: GRPO model vs the best fixed span (chosen on train)",
            best_fixed_span=list(fixed),
            best_fixed_span_miou=round(fixed_miou, 3),
        ),
    }
    if budget.answer_only:
        results["answer_only"] = answer_only
    if guided:
        sampled = series(guided, "guidance/sampled_accuracy_reward")
        unguided = series(ours[: len(sampled)], "rewards/iou_reward/mean")
        results["gt_guidance"] = emit(
            "gt_guidance_gain",
            fifth_means(sampled)[1],
            fifth_means(unguided)[1],
            "mean IoU reward of sampled answers, last 20% of steps: guided+tempsamp vs unguided",
            steps=len(sampled),
            goal="ratio > 1",
        )
    if budget.curate:
        results["curation"] = emit_row(done["curation"]["row"])  # the row the curation worker made
    results.update(twass_rows(done, emit))
    emit("learning_wall_time", time.perf_counter() - started, 15 * 60, "s (ours) vs the 15-minute budget")
    curves = {
        "ours": ours,
        "plain": plain,
        "guided": guided,
        "before": before,
        "after": after,
        "blank": blank,
        "plain_after": plain_after,
        "fixed_miou": fixed_miou,
    }
    (work / "history.json").write_text(json.dumps(curves, default=str))
    if plot_to is not None:
        plot_learning(curves, plot_to)
    return results


def twass_rows(done: dict, emit) -> dict:
    """The twass spread rows (:mod:`video_grpo.bench.twass_rows`) over the groups every run in ``ROLLOUT_RUNS``
    sampled."""
    from video_grpo.bench import twass_rows as twass

    found = {name: done[name]["rollouts"] for name in ("ours", "plain")}
    found.update({f"curation_{k}": v for k, v in done.get("curation", {}).get("rollouts", {}).items()})
    rollouts = {name: found[name] for name in twass.ROLLOUT_RUNS if name in found}
    return twass.spread_rows(rollouts, emit)


def decoded_per_step(history: list[dict]) -> float:
    """Mean tokens decoded per GRPO step: the mean answer length times the step's answers."""
    lengths = series(history, "completions/mean_length")
    return sum(lengths) / len(lengths) * runs.GRPO_SETTINGS["per_device_train_batch_size"]


def answer_only_runs(work: Path, data: Path, steps: int) -> dict:
    """The answer-only side: from its cold start (``work/sft_answer_only``), the same GRPO steps with the IoU reward
    alone, and the test metrics before and after (real and black frames)."""
    start = work / "sft_answer_only"
    train = runs.task_dataset(data / "train.jsonl", prompt=runs.ANSWER_ONLY_PROMPT)
    test = runs.task_dataset(data / "test.jsonl", prompt=runs.ANSWER_ONLY_PROMPT)
    with contextlib.redirect_stdout(sys.stderr):  # trainer logs; the row's JSON line goes to stdout
        return {
            "start": runs.test_metrics(start, test),
            "history": runs.grpo(start, train, work / "answer_only", steps, answer_only=True),
            "end": runs.test_metrics(work / "answer_only", test),
            "blank": runs.test_metrics(
                work / "answer_only", runs.with_transform(test, runs.BlankFrames, runs.ANSWER_ONLY_PROMPT)
            ),
        }


def answer_only_row(side: dict, emit, before: dict | None, after: dict | None, ours) -> dict:
    """The answer-only row from :func:`answer_only_runs`, beside the ``<think>`` run of this benchmark
    (``before``/``after``/``ours``; None: not run here)."""
    start_metrics, history, end_metrics, blank = side["start"], side["history"], side["end"], side["blank"]
    return emit(
        "answer_only",
        end_metrics["mIoU"],
        start_metrics["mIoU"],
        "test mIoU % after vs before GRPO, answer-only cold start and IoU reward alone (TimeLens's setting)",
        blank_after=round(blank["mIoU"], 3),
        parsed_before=round(start_metrics["parsed"], 3),
        parsed_after=round(end_metrics["parsed"], 3),
        think_before=round(before["mIoU"], 3) if before else None,
        think_after=round(after["mIoU"], 3) if after else None,
        decoded_tokens_per_step=round(decoded_per_step(history), 1),
        think_decoded_tokens_per_step=round(decoded_per_step(ours), 1) if ours else None,
        reward_first_fifth=round(fifth_means(series(history, "rewards/iou_reward/mean"))[0], 4),
        reward_last_fifth=round(fifth_means(series(history, "rewards/iou_reward/mean"))[1], 4),
        steps=len(history),
        goal="ours > baseline",
    )


# TempSamp-R1 variants for gt_guidance_gain (docs/learning.md records each one's number): tau of Eq. 4, and guiding
# only the groups whose sampled answers all miss (guidance.group_advantages' ``miss_below``).
GUIDANCE_VARIANTS = {
    "tempsamp, tau 0.8, every group (the benchmark's row)": {},
    "tempsamp, tau 0.5, every group": {"tau": 0.5},
    "tempsamp, tau 0.8, only groups with no sampled IoU >= 0.5": {"miss_below": 0.5},
    "tempsamp, tau 0.8, only groups with no sampled IoU > 0": {"miss_below": 1e-6},
}


def guidance_variants(work: Path, emit, variants: dict[str, dict] = GUIDANCE_VARIANTS) -> dict:
    """``gt_guidance_gain`` for each variant, from the benchmark's task, cold start and unguided run (the same
    seeds, so the same checkpoint and the same unguided log as ``bench learning``)."""
    budget = FULL
    data, _, start = cold_start(work, budget)
    train = runs.task_dataset(data / "train.jsonl")
    with contextlib.redirect_stdout(sys.stderr):
        ours = runs.grpo(start, train, work / "ours", budget.grpo_steps, save=False)
    unguided = fifth_means(series(ours, "rewards/iou_reward/mean"))[1]
    results = {}
    for name, options in variants.items():
        with contextlib.redirect_stdout(sys.stderr):
            guided = runs.grpo(
                start,
                train,
                work / "guided",
                budget.guided_steps,
                save=False,
                gt_guidance=True,
                advantage_shaping="tempsamp",
                answer_template=runs.ANSWER_TEMPLATE,
                guidance_options=options or None,
            )
        sampled = series(guided, "guidance/sampled_accuracy_reward")
        results[name] = emit(
            "gt_guidance_gain",
            fifth_means(sampled)[1],
            unguided,
            f"mean IoU reward of sampled answers, last 20% of steps: {name} vs unguided",
            variant=options,
            steps=len(sampled),
            goal="ratio > 1",
        )
    return results


def answer_only_alone(work: Path, emit, steps: int | None = None, think: bool = True) -> dict:
    """The ``answer_only`` row and the ``<think>`` run it is compared with, without the other rows: the same task,
    seeds and cold starts as ``bench learning`` (``steps``: fewer GRPO steps for both, a reduced run; ``think``
    False: the answer-only side only, its think fields None)."""
    from video_grpo.toys.synthetic import make_flash_split
    from video_grpo.toys.tiny import build_tiny_model

    budget = FULL
    steps = steps or budget.grpo_steps
    if not think:
        data = work / "task"
        make_flash_split(data, "train", budget.train, seed=10, task=budget.task)
        make_flash_split(data, "test", budget.test, seed=11, task=budget.task)
        build_tiny_model(work / "tiny", **runs.MODEL_SIZE)
        runs.answer_only_start(work, data, budget)
        return answer_only_row(answer_only_runs(work, data, steps), emit, None, None, None)
    data, _, start = cold_start(work, budget)
    make_flash_split(data, "test", budget.test, seed=11, task=budget.task)
    train, test = runs.task_dataset(data / "train.jsonl"), runs.task_dataset(data / "test.jsonl")
    with contextlib.redirect_stdout(sys.stderr):
        before = runs.test_metrics(start, test)
        ours = runs.grpo(start, train, work / "ours", steps)
        after = runs.test_metrics(work / "ours", test)
    runs.answer_only_start(work, data, budget)
    return answer_only_row(answer_only_runs(work, data, steps), emit, before, after, ours)


def main() -> int:
    import argparse
    import tempfile

    import torch

    from video_grpo.bench.emit import emit

    parser = argparse.ArgumentParser(
        description="guidance-variants: gt_guidance_gain for each TempSamp-R1 variant (about 8 minutes); "
        "answer-only: the answer_only row beside its <think> run, without the other rows."
    )
    parser.add_argument("command", choices=["guidance-variants", "answer-only"])
    parser.add_argument(
        "--steps", type=int, help="answer-only: GRPO steps for both runs (default: the benchmark's)"
    )
    parser.add_argument("--no_think", action="store_true", help="answer-only: skip the <think> side")
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        if args.command == "answer-only":
            answer_only_alone(Path(tmp), emit, args.steps, think=not args.no_think)
        else:
            guidance_variants(Path(tmp), emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
