"""``python -m video_grpo.bench soak``: does a run keep working, at the same speed and memory, for hundreds of
steps?

A tiny model of a family (Qwen2.5-VL by default, :mod:`video_grpo.toys.tiny`) trains for ``--steps`` GRPO steps
on ``data_samples``'s videos, sampled so that they give six frame counts (2 to 12), with gradient checkpointing on
(TRL's default, so what users run: it is what switched the input-gradient hook on and off twice a step),
β = 0.04 (a reference forward each step too), one generation per step, all weights or LoRA adapters
(``--lora``), an evaluation every ``--eval_every`` steps if asked (outside the timed steps). It runs twice, each
in a fresh process: with ``decode_compile: true`` (``--backend``, inductor by default as on a GPU) and with it
off (eager decoding), one after the other, so that each has the machine's cores to itself for its whole run (side by side, the case that finished first left the other's last tenth alone on the
machine: a false speed-up).

The reward is a hash of each completion's text: it differs within a group (every step has real gradients) but
cannot be learned, so the work per step stays the same over the run and a slower step means the code slowed down.
(The completions' mean length in the first and last tenth is printed beside the time row to show it.)

Rows, per case, each with its goal and whether it was met (JSON lines on stdout, a table on stderr):

- ``soak_step_time_drift``: median step time of the last tenth of the measured steps over that of the first tenth;
  the measured steps start after ``--warmup`` steps (first compile, first allocations). The verdict is on wall
  time; beside it are each tenth's median wall and CPU time of the process and the load average, to tell more
  work from a busier machine (on the 2-core machine both times moved together with the load, by up to 10%);
- ``soak_rss_growth`` and ``soak_tensor_growth``: MB per 100 steps, the slope of a least-squares line through RSS
  after every measured step, and through the bytes of the tensors Python can reach, counted every
  ``--sample_every`` steps (:func:`video_grpo.bench.soak_sizes.tensor_bytes`);
- ``soak_decode_graphs``, ``soak_decode_fallbacks`` and ``soak_compiled_steps``: graphs the compiled step built
  (one per distinct call shape, :class:`video_grpo.rollout.decode.DecodeStats`), its fallbacks to eager decoding and the
  recompiles no new call shape explains, and the steps that decoded through it (``decode/compiled`` = 1);
- ``soak_input_grad_hooks``: the input-embedding gradient hooks after the first and the last step;
- ``soak_growth``: every size of :func:`video_grpo.bench.soak_sizes.container_sizes` at the first measured step
  and the last, and the Python object types whose count grew most.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from video_grpo.bench.emit import emit

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "data_samples"
MB = 2**20
STEP_TIME_GOAL = 1.05  # last tenth over first tenth
GROWTH_GOAL_MB = 20.0  # per 100 steps
# sizes that grow by design: the log history, one entry a step and two an evaluation
GROWS_BY_DESIGN = {"trainer.state.log_history entries"}
NOISY = {"python objects tracked by gc"}  # shown, with the types that grew, but judged by the memory rows


@dataclasses.dataclass(frozen=True)
class SoakSettings:
    steps: int = 300
    warmup: int = 5
    sample_every: int = 10
    family: str = "qwen2_5_vl"
    backend: str = "inductor"
    lora: bool = False  # train LoRA adapters (the reference is the base with them disabled)
    eval_every: int = 0  # evaluate (sampled rewards and greedy grounding) every this many steps; 0: never


def hash_reward(completions, **kwargs) -> list[float]:
    """A number in [0, 1) from each completion's text: it differs within a group but cannot be learned."""
    return [int(hashlib.sha256(str(c).encode()).hexdigest()[:8], 16) / 2**32 for c in completions]


def soak_sampling(family: str):
    """0.2 frames a second between 2 and 12 frames: ``data_samples``'s 10-60 s videos give 2, 4, ..., 12 frames
    (prompts of six widths); 2 x 2 merged tokens a frame pair keep the tiny step short."""
    from video_grpo.data.video import SamplingConfig
    from video_grpo.inputs.families import FAMILIES

    geometry = FAMILIES[family]
    side = 2 * geometry.size_multiple
    return SamplingConfig(
        fps=0.2,
        min_frames=2,
        max_frames=12,
        min_pixels=geometry.size_multiple**2,
        max_pixels=side * side,
        max_tokens=64,
        size_multiple=geometry.size_multiple,
        temporal_patch=geometry.temporal_patch,
    )


def frame_counts(sampling) -> list[int]:
    """The distinct frame counts the soak's videos are sampled to."""
    from video_grpo.data.video import plan_sampling, probe_video

    counts = set()
    for line in (SAMPLES / "train.jsonl").read_text().splitlines():
        entry = json.loads(line)
        meta = probe_video(str(SAMPLES / entry["video"]))
        counts.add(plan_sampling(entry["duration"], meta["height"], meta["width"], sampling)[0])
    return sorted(counts)


def _cache_tokens(sampling, model_dir: Path, completion_tokens: int) -> int | None:
    """The static cache's length as ``python -m video_grpo.grpo`` sizes it from a recipe's video budget."""
    from video_grpo.configs import GRPOScriptArguments
    from video_grpo.plan.startup import decode_cache_tokens

    script = GRPOScriptArguments(
        video_fps=sampling.fps,
        video_min_frames=sampling.min_frames,
        video_max_frames=sampling.max_frames,
        video_min_pixels=sampling.min_pixels,
        video_max_pixels=sampling.max_pixels,
        video_max_tokens=sampling.max_tokens,
    )
    return decode_cache_tokens(script, str(model_dir), completion_tokens)


def build_trainer(model_dir: Path, out_dir: Path, settings: SoakSettings, compiled: bool):
    from transformers import AutoProcessor
    from trl import GRPOConfig

    from video_grpo.data.dataset import build_dataset
    from video_grpo.trainer import VideoGRPOTrainer

    sampling = soak_sampling(settings.family)
    completion_tokens = 16
    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=completion_tokens,
        max_steps=settings.steps,
        learning_rate=1e-5,
        activation_checkpointing=True,
        beta=0.04,
        bf16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        eval_strategy="steps" if settings.eval_every else "no",
        eval_steps=settings.eval_every or None,
        per_device_eval_batch_size=4,
    )
    peft_config = None
    if settings.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return VideoGRPOTrainer(
        model=str(model_dir),
        peft_config=peft_config,
        reward_funcs=[hash_reward],
        args=args,
        train_dataset=build_dataset(SAMPLES / "train.jsonl", sampling=sampling),
        eval_dataset=build_dataset(SAMPLES / "test.jsonl", sampling=sampling)
        if settings.eval_every
        else None,
        grounding_eval_samples=4,
        processing_class=AutoProcessor.from_pretrained(model_dir),
        decode_compile="true" if compiled else "false",
        decode_compile_backend=settings.backend,
        decode_cache_tokens=_cache_tokens(sampling, model_dir, completion_tokens) if compiled else None,
    )


def run_case(model_dir: Path, settings: SoakSettings, compiled: bool) -> dict:
    """One case's whole run, in this process; what it measured as plain data."""
    from transformers import PrinterCallback

    from video_grpo.bench.soak_recorder import SoakRecorder

    label = f"compiled ({settings.backend})" if compiled else "eager"
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(sys.stderr):
        trainer = build_trainer(model_dir, Path(out), settings, compiled)
        recorder = SoakRecorder(trainer, settings.steps, settings.warmup + 1, settings.sample_every, label)
        trainer.remove_callback(PrinterCallback)  # its log dict per step would bury the progress bars
        trainer.add_callback(recorder)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    history = trainer.state.log_history
    decoder = trainer.decoder
    return {
        "case": label,
        "seconds": seconds,
        "record": dataclasses.asdict(recorder.record),
        "compiled_flags": [entry["decode/compiled"] for entry in history if "decode/compiled" in entry],
        "lengths": [
            entry["completions/mean_length"] for entry in history if "completions/mean_length" in entry
        ],
        "graphs": decoder.stats.graphs if decoder is not None else 0,
        "graph_keys": len(decoder.stats.graph_keys) if decoder is not None else 0,
        **{
            name: getattr(decoder.stats, name) if decoder is not None else 0
            for name in ("fallbacks", "unexpected_recompiles", "cache_growths")
        },
        "last_guard_failure": decoder.stats.last_guard_failure if decoder is not None else "",
    }


def _run_case_in_child(arguments: tuple) -> dict:
    """A case in its own process, transformers quiet, one thread: the tiny model gains nothing from two, and on a
    machine shared with other jobs a two-thread op waits for whichever core another job holds (steps of 0.3 s took
    2-7 s that way here)."""
    import torch
    from transformers.utils import logging as hf_logging

    os.dup2(2, 1)  # the parent's stdout carries JSON lines only; libraries here print their notices on stdout
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    return run_case(*arguments)


# -- the rows ----------------------------------------------------------------------------------------------------


def tenths(values: list[float]) -> tuple[list[float], list[float]]:
    tenth = max(1, len(values) // 10)
    return values[:tenth], values[-tenth:]


def tenth_parts(values: list[float]) -> list[list[float]]:
    """``values`` in ten consecutive parts of equal length (the remainder, if any, left out): the drift's shape."""
    size = max(1, len(values) // 10)
    return [values[start : start + size] for start in range(0, size * min(10, len(values)), size)]


def slope_per_100(steps: list[int], values: list[float]) -> float:
    """Least-squares slope of ``values`` over ``steps``, per 100 steps (0 with fewer than two points)."""
    if len(steps) < 2:
        return 0.0
    mean_x, mean_y = statistics.fmean(steps), statistics.fmean(values)
    spread = sum((x - mean_x) ** 2 for x in steps)
    if spread == 0:
        return 0.0
    return 100 * sum((x - mean_x) * (y - mean_y) for x, y in zip(steps, values, strict=True)) / spread


def grown_types(early: dict[str, int], last: dict[str, int], top: int = 8) -> dict[str, int]:
    """The ``top`` Python object types whose count grew most between the two snapshots."""
    growth = {name: last.get(name, 0) - early.get(name, 0) for name in set(early) | set(last)}
    return dict(sorted(((n, g) for n, g in growth.items() if g > 0), key=lambda item: -item[1])[:top])


def case_rows(result: dict, settings: SoakSettings) -> list[dict]:
    """The rows of one case (emitted as JSON lines); each has ``goal`` and ``met``."""
    record, case = result["record"], result["case"]
    first = settings.warmup + 1  # the first measured step
    common = {"case": case, "steps": settings.steps, "warmup_steps": settings.warmup}
    rows = []
    measured = record["step_seconds"][settings.warmup :]
    head, tail = tenths(measured)
    lengths_head, lengths_tail = tenths(result["lengths"][settings.warmup :])
    load_head, load_tail = tenths(record["load"][settings.warmup :])
    drift = statistics.median(tail) / statistics.median(head)
    rows.append(
        emit(
            "soak_step_time_drift",
            statistics.median(tail),
            statistics.median(head),
            "s per step, median of the last tenth of the measured steps (ours) and of the first (baseline)",
            goal=f"ratio <= {STEP_TIME_GOAL}",
            met=drift <= STEP_TIME_GOAL,
            steps_per_tenth=len(head),
            median_ms_per_tenth=[round(1000 * statistics.median(part), 1) for part in tenth_parts(measured)],
            cpu_median_ms_per_tenth=[
                round(1000 * statistics.median(part), 1)
                for part in tenth_parts(record["step_cpu_seconds"][settings.warmup :])
            ],
            slope_ms_per_100_steps=round(
                1000 * slope_per_100(list(range(settings.warmup + 1, settings.steps + 1)), measured), 3
            ),
            load_average_first_last_tenth=[
                round(statistics.fmean(load_head), 2),
                round(statistics.fmean(load_tail), 2),
            ],
            mean_completion_tokens_first_last_tenth=[
                round(statistics.fmean(lengths_head), 2),
                round(statistics.fmean(lengths_tail), 2),
            ],
            **common,
        )
    )
    steps = list(range(first, settings.steps + 1))
    rss = slope_per_100(steps, [value / MB for value in record["rss"][settings.warmup :]])
    rows.append(
        emit(
            "soak_rss_growth",
            rss,
            None,
            "MB per 100 steps (least-squares slope of RSS after each measured step)",
            goal=f"<= {GROWTH_GOAL_MB:g} MB per 100 steps",
            met=rss <= GROWTH_GOAL_MB,
            rss_mb_first_last=[
                round(record["rss"][settings.warmup] / MB, 1),
                round(record["rss"][-1] / MB, 1),
            ],
            **common,
        )
    )
    sampled = [
        (s, b / MB) for s, b in zip(record["tensor_steps"], record["tensor_bytes"], strict=True) if s >= first
    ]
    tensors = slope_per_100([s for s, _ in sampled], [b for _, b in sampled])
    rows.append(
        emit(
            "soak_tensor_growth",
            tensors,
            None,
            f"MB per 100 steps (slope of the bytes of tensors Python reaches, every {settings.sample_every} steps)",
            goal=f"<= {GROWTH_GOAL_MB:g} MB per 100 steps",
            met=tensors <= GROWTH_GOAL_MB,
            tensor_mb_first_last=[round(sampled[0][1], 2), round(sampled[-1][1], 2)] if sampled else None,
            **common,
        )
    )
    compiled_case = case != "eager"
    compiled_steps = sum(flag == 1.0 for flag in result["compiled_flags"])
    rows.append(
        emit(
            "soak_decode_graphs",
            result["graphs"],
            result["graph_keys"],
            "graphs compiled (ours) against distinct call shapes (rows, cache length, mode: baseline)",
            goal="one graph per call shape" if compiled_case else "none (eager)",
            met=result["graphs"] == result["graph_keys"] if compiled_case else result["graphs"] == 0,
            **common,
        )
    )
    rows.append(
        emit(
            "soak_decode_fallbacks",
            result["fallbacks"] + result["unexpected_recompiles"],
            None,
            "fallbacks to eager decoding + recompiles no new call shape explains (video_grpo.rollout.decode.DecodeStats)",
            goal="none",
            met=result["fallbacks"] + result["unexpected_recompiles"] == 0,
            fallbacks=result["fallbacks"],
            unexpected_recompiles=result["unexpected_recompiles"],
            cache_growths=result["cache_growths"],
            last_guard_failure=result["last_guard_failure"],
            **common,
        )
    )
    rows.append(
        emit(
            "soak_compiled_steps",
            compiled_steps,
            len(result["compiled_flags"]),
            "steps that decoded through the compiled step (decode/compiled = 1) of the steps logged",
            goal="every step" if compiled_case else "none (eager)",
            met=compiled_steps == len(result["compiled_flags"]) if compiled_case else compiled_steps == 0,
            **common,
        )
    )
    hooks = record["hooks"]
    rows.append(
        emit(
            "soak_input_grad_hooks",
            hooks[-1],
            hooks[0],
            "input-embedding gradient hooks after the last step (ours) and the first (baseline)",
            goal="as many after the last step as after the first",
            met=hooks[-1] == hooks[0],
            **common,
        )
    )
    early, last = record["early_sizes"], record["last_sizes"]
    evaluations = settings.steps // settings.eval_every if settings.eval_every else 0
    logged = settings.steps - first + 2 * evaluations  # the log gains one entry a step, two an evaluation
    for name in sorted(early):
        grows_by_design = name in GROWS_BY_DESIGN
        extra = (
            {"types_grown_most": grown_types(record["early_types"], record["last_types"])}
            if name in NOISY
            else {}
        )
        rows.append(
            emit(
                "soak_growth",
                last[name],
                early[name],
                f"{name}: at step {settings.steps} (ours) and step {first} (baseline)",
                goal="one per step, two per evaluation"
                if grows_by_design
                else ("reported" if name in NOISY else "no growth"),
                met=(
                    last[name] - early[name] <= logged
                    if grows_by_design
                    else (None if name in NOISY else last[name] <= early[name])
                ),
                size=name,
                **extra,
                **common,
            )
        )
    return rows


def _shown(value) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3f}"


def verdict_table(rows: list[dict]) -> str:
    """The rows as a table for people: verdict, case, row, value (ours / baseline, and the ratio for time), goal."""
    lines = []
    for row in rows:
        verdict = {True: "PASS", False: "MISS", None: "info"}[row["met"]]
        name = row["name"] + (f" [{row['size']}]" if "size" in row else "")
        value = _shown(row["ours"]) + ("" if row["baseline"] is None else f" / {_shown(row['baseline'])}")
        if row["name"] == "soak_step_time_drift":
            value += f" = {row['ratio']:.3f}"
        lines.append(f"{verdict}  {row['case']:<20} {name:<58} {value:>24}   goal: {row['goal']}")
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SoakSettings()
    parser.add_argument("--steps", type=int, default=defaults.steps, help="GRPO steps per case (default 300)")
    parser.add_argument(
        "--warmup", type=int, default=defaults.warmup, help="first steps left out of every row (default 5)"
    )
    parser.add_argument(
        "--sample_every", type=int, default=defaults.sample_every, help="steps between tensor-byte counts"
    )
    parser.add_argument(
        "--family",
        default=defaults.family,
        choices=["qwen2_5_vl", "qwen3_vl", "qwen3_5"],
        help="tiny model family",
    )
    parser.add_argument(
        "--backend",
        default=defaults.backend,
        choices=["inductor", "aot_eager", "eager"],
        help="the compiled case's backend (default inductor, what a GPU run gets; aot_eager compiles in seconds)",
    )
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (r = 8 on q_proj, v_proj)")
    parser.add_argument(
        "--eval_every",
        type=int,
        default=defaults.eval_every,
        help="evaluate every N steps (sampled rewards, then greedy grounding on 4 test videos; default never); "
        "the warm-up then lasts at least N steps, so that it includes the first evaluation",
    )
    parser.add_argument("--save", type=Path, help="write each case's per-step record here (JSON)")
    parser.add_argument("--check", action="store_true", help="exit 1 if any row misses its goal")


def soak(args: argparse.Namespace) -> int:
    """Run both cases, print their rows; 1 with ``--check`` if a goal was missed."""
    from video_grpo.toys.tiny import build_tiny_model

    settings = SoakSettings(
        steps=args.steps,
        warmup=max(args.warmup, args.eval_every),  # the first evaluation compiles its graph: warm-up too
        sample_every=args.sample_every,
        family=args.family,
        backend=args.backend,
        lora=args.lora,
        eval_every=args.eval_every,
    )
    if settings.steps < settings.warmup + 10:
        raise SystemExit(
            f"--steps must be at least --warmup + 10 ({settings.warmup + 10}): each tenth needs a step"
        )
    print(
        f"soak: {settings}; frame counts of the videos: {frame_counts(soak_sampling(settings.family))}",
        file=sys.stderr,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / f"tiny-{settings.family}", family=settings.family)
        cases = [(model_dir, settings, compiled) for compiled in (True, False)]
        context = multiprocessing.get_context(
            "spawn"
        )  # a fresh process per case: its own RSS and dynamo state
        with context.Pool(1, maxtasksperchild=1) as pool:
            results = pool.map(_run_case_in_child, cases, chunksize=1)
    if args.save:
        args.save.write_text(json.dumps({"settings": dataclasses.asdict(settings), "cases": results}))
    rows = [row for result in results for row in case_rows(result, settings)]
    print(verdict_table(rows), file=sys.stderr)
    wall = time.perf_counter() - started
    print(
        f"soak: {wall / 60:.1f} min in all ("
        + ", ".join(f"{result['case']}: {result['seconds'] / 60:.1f} min training" for result in results)
        + f"); {os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    return exit_code(rows, args.check)


def exit_code(rows: list[dict], check: bool) -> int:
    """1 with ``--check`` if any row missed its goal (an informational row, ``met`` None, never does), else 0."""
    return 1 if check and any(row["met"] is False for row in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return soak(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
