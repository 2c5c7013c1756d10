"""Every shipped recipe planned as the planner's tests check it, in one call: what ``--json`` prints on the launch
its header names, the GPUs it fits, its peak with ``shared_prefix`` and encode-once off, and the line saying which
model config was used. tests/test_plan.py runs it once in a fresh process (as a user runs the planner) and once
in-process after training steps, and compares the two to the byte.

    python tests/plan_all.py '{"qwen3_5": "/tmp/tiny-qwen3_5", ...}'   # prints one JSON line
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs" / "grpo").glob("*.yaml"))
HEADER = re.compile(r"^# Plan: fits (?P<gpus>[\w, -]+) with (?P<launch>configs/accelerate/\S+\.yaml)", re.M)
FAMILIES = ("qwen3_5", "qwen3_vl", "qwen2_5_vl")


def tiny_family(recipe: Path) -> str | None:
    """The family of a CPU recipe's tiny model (its model is made by `make demo`/`make tiny`), or None for a
    recipe of a published model (a GPU recipe)."""
    from video_grpo.plan.model import shipped_model_configs

    model = (yaml.safe_load(recipe.read_text()) or {}).get("model_name_or_path")
    if model in shipped_model_configs():
        return None
    return next((f for f in FAMILIES if f in recipe.stem), "qwen2_5_vl")


def plan_all(tiny: dict[str, str]) -> dict[str, dict]:
    """recipe stem -> what the tests check of its plan. ``tiny``: family -> a tiny model folder of that family,
    for the CPU recipes (planned on one CPU process of 24 GB)."""
    from video_grpo.plan import GB, make_plan, plan_recipe, resolve_gpu
    from video_grpo.plan.cli import plan_json
    from video_grpo.plan.compute import GPUS

    out = {}
    for recipe in RECIPES:
        family = tiny_family(recipe)
        if family is not None:
            model = Path(tiny[family])
            plan = plan_recipe(
                str(recipe),
                gpu="cpu",
                gpu_memory_gb=24,
                model_config=str(model / "config.json"),
                overrides={"model_name_or_path": str(model)},
            )
            out[recipe.stem] = {"json": plan_json(plan)}
            continue
        header = HEADER.search(recipe.read_text())
        launch = header["launch"] if header else "configs/accelerate/zero3.yaml"
        # no --model_config: the recipe's Hub model is one of configs/models/, used offline without being asked
        plan = plan_recipe(str(recipe), launch, gpu="h100-80gb")
        off = make_plan(plan.shape, plan.work.replace(shared_prefix=False, encode_once=False), plan.gpu)
        out[recipe.stem] = {
            "json": plan_json(plan),
            "launch": launch,
            "source": plan.source,
            "fits": [g for g in GPUS if dataclasses.replace(plan, gpu=resolve_gpu(g, None)).fits],
            "fit_table_gb": [round(plan.memory.peak / GB, 1), round(off.memory.peak / GB, 1)],
        }
    return out


if __name__ == "__main__":
    print(json.dumps(plan_all(json.loads(sys.argv[1]))))
