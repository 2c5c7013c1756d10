"""Every shipped recipe planned as the planner's tests check it, in one call: what ``--json`` prints on the launch
its header names, the GPUs it fits, and the line saying which model config was used. tests/test_plan.py runs it once
in a fresh process (as a user runs the planner on a fresh clone: the plan cache shipped in the package read, the
rest traced), with the report of the command the docs show and the docs' blocks that ``python -m video_grpo.plan
--markdown`` writes (made from the same plans, so planning them is not done twice) and the shipped keys' entries it
held, and once in-process after training steps with the cache off, and compares the two to the byte.

    python tests/plan_all.py '{"qwen3_5": "/tmp/tiny-qwen3_5", ...}'   # prints one JSON line
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from video_grpo.plan.doc_tables import DocPlans

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs" / "grpo").glob("*.yaml"))
FAMILIES = ("qwen3_5", "qwen3_vl", "qwen2_5_vl")


def tiny_family(recipe: Path) -> str | None:
    """The family of a CPU recipe's tiny model (its model is made by `make demo`/`make tiny`), or None for a
    recipe of a published model (a GPU recipe)."""
    from video_grpo.plan.model import shipped_model_configs

    model = (yaml.safe_load(recipe.read_text()) or {}).get("model_name_or_path")
    if model in shipped_model_configs():
        return None
    return next((f for f in FAMILIES if f in recipe.stem), "qwen2_5_vl")


DOCUMENTED = [  # the command docs/planning.md shows first (no --model_config: the shipped config, offline)
    "--config",
    "configs/grpo/qwen2_5_vl_7b_charades.yaml",
    "--accelerate_config",
    "configs/accelerate/zero3.yaml",
    "--gpu",
    "h100-80gb",
]


def plan_all(
    tiny: dict[str, str], plans: DocPlans | None = None, recipes: list[Path] | None = None
) -> dict[str, dict]:
    """recipe stem -> what the tests check of its plan. ``tiny``: family -> a tiny model folder of that family,
    for the CPU recipes (planned on one CPU process of 24 GB). ``plans``: where the GPU recipes' plans are made and
    kept (for the docs' blocks). ``recipes``: these (default: every shipped one)."""
    from video_grpo.plan import plan_recipe, resolve_gpu
    from video_grpo.plan.cli import plan_json
    from video_grpo.plan.compute import GPUS
    from video_grpo.plan.doc_tables import DocPlans

    plans = plans or DocPlans(REPO)
    out = {}
    for recipe in RECIPES if recipes is None else recipes:
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
        # plan_recipe on the launch the header names, on an H100, with no --model_config: the recipe's Hub model is
        # one of configs/models/, used offline without being asked
        plan = plans.plan(recipe.stem)
        out[recipe.stem] = {
            "json": plan_json(plan),
            "launch": plans.launch(recipe.stem),
            "source": plan.source,
            "fits": [g for g in GPUS if dataclasses.replace(plan, gpu=resolve_gpu(g, None)).fits],
        }
    return out


def documented_report() -> dict[str, object]:
    """What ``python -m video_grpo.plan`` with :data:`DOCUMENTED` prints (its exit code, stdout and stderr)."""
    import contextlib
    import io

    from video_grpo.plan import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(DOCUMENTED)
    return {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from tests.conftest import our_warnings_are_errors

    our_warnings_are_errors()  # the planner, as a user runs it, causes no warning of its own (imports included)
    from video_grpo.plan import cache
    from video_grpo.plan.cli import recipe_auto_fit
    from video_grpo.plan.doc_tables import DocPlans
    from video_grpo.plan.shipped import exercise, shipped_keys

    doc_plans = DocPlans(REPO)
    tiny = json.loads(sys.argv[1])
    planned = plan_all(tiny, doc_plans)
    docs = exercise(doc_plans, recipe_auto_fit)  # the docs' blocks, and all that the shipped cache is made of
    report = documented_report()
    # the shipped keys' entries this process held at the end: read from the shipped files, or traced on a miss
    print(
        json.dumps(
            {
                "plans": planned,
                "report": report,
                "docs": docs,
                "shipped": cache.kept(shipped_keys()),
                "tiny": tiny,
            }
        )
    )
