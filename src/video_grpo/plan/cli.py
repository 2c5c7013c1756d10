"""Will it fit, and how long will it take? Plan a recipe's GPU memory and step time before renting the GPUs.

    python -m video_grpo.plan --config configs/grpo/qwen2_5_vl_7b_charades.yaml \\
        --accelerate_config configs/accelerate/zero3.yaml --gpu h100-80gb
    python -m video_grpo.plan --config RECIPE.yaml --num_processes 8 --zero_stage 3 --gpu_memory_gb 48 --json

No weights are loaded. The model's ``config.json`` comes from ``--model_config``, or from the recipe's
``model_name_or_path`` when it is a local folder or in the Hugging Face cache, or else, for the supported models,
from the published config shipped in ``configs/models/`` (said in one line on stderr). Nothing is downloaded. The video is planned at the worst case the recipe allows, every answer
at ``max_completion_length``.

Memory per GPU is given by phase (generation, old-policy/reference forwards, loss forward + backward, optimizer
step) and by category, with the peak, its phase and its largest category, and a verdict against the GPU that keeps
:data:`HEADROOM` free. When it does not fit, the cheapest changes that would are listed with their new peak.
Compute is given as FLOPs per phase and, for a named GPU, seconds per phase at stated efficiencies.
``--gpu cpu`` plans one CPU process with no headroom: what the tests and benchmarks measure.
``--auto_fit`` prints what ``auto_fit: true`` would change in a training run on that GPU
(:mod:`video_grpo.plan.autofit`), before renting it.

    python -m video_grpo.plan --markdown [--write | --check]

regenerates the tables and the worked example of README.md and docs/planning.md (:mod:`video_grpo.plan.docs`):
printed, written between their markers, or checked (exit code 1 and a diff when a page differs).

    python -m video_grpo.plan --shipped_cache

traces the shipped GPU recipes afresh and rewrites the plan cache shipped in the package
(:mod:`video_grpo.plan.shipped`), which a first plan on a fresh clone reads instead of tracing.
"""

from __future__ import annotations

import argparse
import json
import sys

from video_grpo.plan.autofit import FitResult, auto_fit
from video_grpo.plan.compute import GPUS
from video_grpo.plan.docs import markdown
from video_grpo.plan.fitting import suggestions
from video_grpo.plan.loss_split import LossSettings
from video_grpo.plan.recipe import GB, Plan, plan_recipe
from video_grpo.plan.report import report
from video_grpo.plan.shipped import regenerate
from video_grpo.plan.workload import recipe_values


def plan_json(plan: Plan) -> dict:
    """What ``--json`` prints: the plan's JSON, with the changes that fit when it does not."""
    out = plan.as_json()
    if plan.fits is False:
        out["suggestions"] = [{"change": c, "peak_gb": round(p / GB, 3)} for c, p in suggestions(plan)]
    return out


def recipe_auto_fit(plan: Plan, config: str) -> FitResult:
    """What ``--auto_fit`` prints for a recipe file's plan (and the docs' worked example shows)."""
    return auto_fit(plan, LossSettings.of(recipe_values(config)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="the recipe YAML (required, except with --markdown)")
    parser.add_argument("--accelerate_config", help="the accelerate config the run launches with")
    parser.add_argument("--num_processes", type=int, help="GPUs in all (overrides the accelerate config)")
    parser.add_argument("--zero_stage", type=int, choices=[0, 1, 2, 3], help="DeepSpeed ZeRO stage (0: none)")
    parser.add_argument("--gpu", choices=[*GPUS, "cpu"], help="the GPU to plan for")
    parser.add_argument(
        "--gpu_memory_gb", type=float, help="the GPU's memory, if not a named GPU (or to override)"
    )
    parser.add_argument(
        "--model_config", help="the model's config.json (or its folder), for offline planning"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the report")
    parser.add_argument(
        "--auto_fit",
        action="store_true",
        help="print what auto_fit: true would change to fit the GPU (needs --gpu or --gpu_memory_gb)",
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the tables and the worked example of README.md and docs/planning.md (no --config)",
    )
    parser.add_argument(
        "--shipped_cache",
        action="store_true",
        help="trace the shipped GPU recipes afresh and rewrite the plan cache shipped in the package (no --config)",
    )
    written = parser.add_mutually_exclusive_group()
    written.add_argument(
        "--write", action="store_true", help="with --markdown: rewrite them between their markers"
    )
    written.add_argument(
        "--check", action="store_true", help="with --markdown: exit 1 with a diff where a page differs"
    )
    args = parser.parse_args(argv)
    if args.shipped_cache:
        return regenerate(recipe_auto_fit)
    if args.markdown:
        return markdown(recipe_auto_fit, "write" if args.write else "check" if args.check else "print")
    if args.write or args.check:
        parser.error("--write and --check go with --markdown")
    if args.config is None:
        parser.error("--config is required (or --markdown)")
    try:
        plan = plan_recipe(
            args.config,
            args.accelerate_config,
            args.num_processes,
            args.zero_stage,
            args.gpu,
            args.gpu_memory_gb,
            args.model_config,
        )
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if plan.source:
        print(plan.source, file=sys.stderr)
    if args.auto_fit:
        if plan.gpu is None:
            print("error: --auto_fit needs a device: --gpu or --gpu_memory_gb", file=sys.stderr)
            return 2
        fitted = recipe_auto_fit(plan, args.config)
        print(json.dumps(fitted.as_json()) if args.json else fitted.summary())
        return 0
    if args.json:
        print(json.dumps(plan_json(plan)))
    else:
        print(report(plan))
    return 0
