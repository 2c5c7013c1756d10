"""What the TimeLens presets cost, planned (``video_grpo.plan``; no GPU, no weights): per-GPU peak and seconds per
phase of one optimizer step, beside the same recipe with ``shared_prefix`` and encode-once off, and beside the same
recipe with ``<think>`` answers of a TimeZero-style recipe (its prompt, 1,024 completion tokens).

    python -m video_grpo.bench.recipe_costs [--gpu h200-141gb]

Prints a Markdown table (docs/planning.md, "The TimeLens presets") and each preset's ``# Plan:`` header line. Every
answer is planned at ``max_completion_length``: an answer-only sentence is about 15 tokens, so the answer-only
rows are upper bounds on generation time (the planner has no answer-length setting).
"""

from __future__ import annotations

import argparse
import dataclasses

from video_grpo.data.prompts import DEFAULT_PROMPT
from video_grpo.plan.recipe import GB

PRESETS = (
    ("TimeLens-7B", "configs/grpo/timelens_qwen2_5_vl_7b.yaml", "configs/models/qwen2_5_vl_7b_instruct.json"),
    ("TimeLens-8B", "configs/grpo/timelens_qwen3_vl_8b.yaml", "configs/models/qwen3_vl_8b_instruct.json"),
)
LAUNCH = "configs/accelerate/zero1.yaml"
THINK = {
    "prompt_template": DEFAULT_PROMPT,
    "max_completion_length": 1024,
}  # timezero_qwen2_5_vl_7b_charades.yaml
VARIANTS = (
    ("as shipped", {}, {}),
    ("shared_prefix and encode-once off", {"shared_prefix": False}, {"encode_once": False}),
    ("<think> answers, 1,024 tokens (TimeZero-style)", THINK, {}),
    (
        "<think> answers, shared_prefix and encode-once off",
        {**THINK, "shared_prefix": False},
        {"encode_once": False},
    ),
)


def variant_plan(recipe: str, model_config: str, gpu: str, overrides: dict, work_changes: dict):
    from video_grpo.plan.recipe import make_plan, plan_recipe

    plan = plan_recipe(recipe, LAUNCH, gpu=gpu, model_config=model_config, overrides=overrides)
    if work_changes:  # encode-once has no recipe field (it is always on); the planner's workload has one
        plan = make_plan(plan.shape, dataclasses.replace(plan.work, **work_changes), plan.gpu)
    return plan


def fitting_gpus(plan) -> list[str]:
    from video_grpo.plan.compute import GPUS
    from video_grpo.plan.recipe import resolve_gpu

    return [gpu for gpu in GPUS if dataclasses.replace(plan, gpu=resolve_gpu(gpu, None)).fits]


def rows(gpu: str) -> list[str]:
    lines = [
        "| recipe | variant | peak per GPU (phase) | generation s | old/ref s | loss s | step s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, recipe, model_config in PRESETS:
        for label, overrides, work_changes in VARIANTS:
            plan = variant_plan(recipe, model_config, gpu, overrides, work_changes)
            seconds = plan.seconds or {}
            lines.append(
                f"| {name} | {label} | {plan.memory.peak / GB:.1f} GB ({plan.memory.peak_phase}) | "
                f"{seconds.get('generation', 0):.2f} | {seconds.get('old_and_reference', 0):.2f} | "
                f"{seconds.get('loss', 0):.2f} | {sum(seconds.values()):.2f} |"
            )
    return lines


def headers() -> list[str]:
    lines = []
    for name, recipe, model_config in PRESETS:
        plan = variant_plan(recipe, model_config, None, {}, {})
        lines.append(
            f"{name}: # Plan: fits {', '.join(fitting_gpus(plan))} with {LAUNCH}  "
            f"(peak {plan.memory.peak / GB:.1f} GB per GPU)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m video_grpo.bench.recipe_costs", description=__doc__)
    parser.add_argument("--gpu", default="h200-141gb", help="the GPU whose seconds per phase are printed")
    args = parser.parse_args(argv)
    print("\n".join(rows(args.gpu)))
    print("\n".join(headers()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
