"""``python -m video_grpo.plan --markdown [--write | --check]``: the planner's numbers in the docs, regenerated.

Every block (:data:`BLOCKS`: the page it lives in and what makes it) is printed, written between its markers
(:mod:`video_grpo.plan.doc_blocks`), or checked against the committed pages, with a diff and exit code 1 when a
page differs. ``tests/test_plan.py`` makes the same blocks in the process that plans every shipped recipe.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from video_grpo.plan.doc_blocks import begin_marker, check_pages, end_marker, write_pages
from video_grpo.plan.doc_example import auto_fit_example
from video_grpo.plan.doc_tables import (
    DocPlans,
    FitFunction,
    readme_fit_table,
    recipe_table,
    recipe_times,
    settings_table,
)

BLOCKS: dict[str, tuple[str, Callable[[DocPlans, FitFunction], str]]] = {
    "fit-table": ("README.md", lambda plans, fit: readme_fit_table(plans)),
    "recipe-table": ("docs/planning.md", lambda plans, fit: recipe_table(plans)),
    "recipe-times": ("docs/planning.md", lambda plans, fit: recipe_times(plans)),
    "gpu-settings": ("docs/planning.md", lambda plans, fit: settings_table(plans)),
    "auto-fit-example": ("docs/planning.md", auto_fit_example),
}


def render_blocks(plans: DocPlans, fit: FitFunction) -> dict[str, tuple[str, str]]:
    """Every block: name -> (its page, its content)."""
    return {name: (page, make(plans, fit)) for name, (page, make) in BLOCKS.items()}


def markdown(fit: FitFunction, mode: str) -> int:
    """``mode``: ``print`` (each block between its markers), ``write`` or ``check``."""
    plans = DocPlans()
    blocks = render_blocks(plans, fit)
    if mode == "write":
        changed = write_pages(plans.root, blocks)
        print(f"rewrote {', '.join(changed)}" if changed else "every block was up to date")
        return 0
    if mode == "check":
        diffs = check_pages(plans.root, blocks)
        if diffs:
            print("".join(diffs))
            print(
                f"{len(diffs)} block(s) differ from what the planner gives; "
                "python -m video_grpo.plan --markdown --write rewrites them",
                file=sys.stderr,
            )
            return 1
        print(f"all {len(blocks)} blocks are what the planner gives")
        return 0
    for name, (page, content) in blocks.items():
        print(f"{page}:\n{begin_marker(name)}\n{content}\n{end_marker(name)}\n")
    return 0
