"""``python -m video_grpo.bench perf [--quick]``, ``python -m video_grpo.bench learning [--plot P] [--quick | --suite]``,
``python -m video_grpo.bench plan [--quick]`` and ``python -m video_grpo.bench soak [--steps N] [--check]``: the
benchmarks, one JSON line per measurement on stdout (everything else goes to stderr)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import torch

import video_grpo.bench.emit as json_lines
from video_grpo.bench import perf


class _TrainerLogsToStderr(contextlib.redirect_stdout):
    """Trainer prints its log dicts on stdout; the benchmark's stdout is JSON lines only."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.bench",
        description=perf.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    perf_parser = sub.add_parser("perf", help="performance measurements")
    perf_parser.add_argument("--quick", action="store_true", help="fewer repeats; under 3 minutes on 2 cores")
    learning_parser = sub.add_parser(
        "learning", help="SFT then GRPO on a synthetic task: does it learn to look?"
    )
    learning_parser.add_argument("--plot", type=Path, help="write the curves + test-mIoU bars PNG here")
    learning_parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer test queries and GRPO steps, no guidance/curation runs (about 5 minutes); "
        "a smoke run: 40 steps are too few to show the gain",
    )
    learning_parser.add_argument(
        "--suite",
        action="store_true",
        help="the full run less its guided and answer-only arms (tests/test_learning.py); every row it emits is "
        "the full run's",
    )
    learning_parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="processes the independent runs share (default 2; the rows do not depend on it)",
    )
    plan_parser = sub.add_parser("plan", help="the memory and FLOPs planner against measured steps")
    plan_parser.add_argument("--quick", action="store_true", help="five small cells (about a minute)")
    plan_parser.add_argument(
        "--no_full_depth", action="store_true", help="skip the full-depth 3B and 7B traces"
    )
    plan_parser.add_argument(
        "--speed_only",
        action="store_true",
        help="only the planner's own speed: the command and every shipped recipe, cold and warm",
    )
    plan_parser.add_argument("--speed_runs", type=int, default=3, help="fresh processes per speed figure")
    plan_parser.add_argument(
        "--cells",
        help="START:END, a slice of the grid's cells (split a run over processes; 0:0 runs no cell)",
    )
    from video_grpo.bench import soak

    soak_parser = sub.add_parser(
        "soak",
        help="hundreds of GRPO steps, compiled and eager decoding: does time or memory drift?",
        description=soak.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    soak.add_arguments(soak_parser)
    args = parser.parse_args(argv)
    if args.command == "soak":
        json_lines.emit_stream = sys.stdout
        with _TrainerLogsToStderr():
            return soak.soak(args)
    if args.command == "plan":
        from video_grpo.bench.plan_check import plan_rows

        json_lines.emit_stream = sys.stdout
        with _TrainerLogsToStderr():
            cells = (
                slice(*(int(part) if part else None for part in args.cells.split(":")))
                if args.cells
                else None
            )
            if not args.speed_only:
                plan_rows(args.quick, full_depth=not args.no_full_depth, cells=cells)
            from video_grpo.bench.plan_speed import plan_speed_rows

            plan_speed_rows(args.speed_runs)
    elif args.command == "perf":
        json_lines.emit_stream = sys.stdout
        with _TrainerLogsToStderr():
            perf.perf(args.quick)
    elif args.command == "learning":
        if args.quick and args.suite:
            parser.error("learning: --quick and --suite are two different budgets; give one")
        json_lines.emit_stream = sys.stdout
        with _TrainerLogsToStderr(), tempfile.TemporaryDirectory() as tmp:
            from transformers.utils import logging as hf_logging

            from video_grpo.bench.learning import run

            hf_logging.set_verbosity_error()
            torch.manual_seed(0)
            run(
                Path(tmp),
                json_lines.emit,
                args.plot,
                quick=args.quick,
                workers=args.workers,
                suite=args.suite,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
