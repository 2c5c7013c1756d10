"""``python -m video_grpo.plan --shipped_cache``: the plan cache shipped in the package, made again from fresh traces.

A fresh clone's first plan of a shipped GPU recipe would trace every layer (about 28 s, imports included); the
entries it needs depend only on the model's config, the planner's source and the pinned versions
(:mod:`video_grpo.plan.cache`), so they are shipped in ``video_grpo/plan/shipped/`` and read under the user's disk
cache. They are what planning the shipped GPU recipes as the command and the docs do leaves in the process
(:func:`exercise`): each recipe on the launch its header names, its report and the changes that fit, and every
block ``--markdown`` writes; of those, the entries of the models in ``configs/models/`` and TRL's defaults
(:func:`shipped_keys`). ``tests/test_plan.py`` fails when its fresh process needs an entry they lack or a file no
key reads, and when an entry differs from what it traces in-process with the cache off.
"""

from __future__ import annotations

import os
from pathlib import Path

from video_grpo.plan import cache
from video_grpo.plan.doc_tables import DocPlans, FitFunction
from video_grpo.plan.docs import render_blocks
from video_grpo.plan.fitting import suggestions
from video_grpo.plan.model import shipped_model_configs
from video_grpo.plan.report import report

COMMAND = "python -m video_grpo.plan --shipped_cache"


def shipped_keys() -> set[str]:
    """The keys whose entries are shipped: each shipped model config as the command reads it (no
    ``--model_config``: :func:`video_grpo.plan.model.find_config_file`), and TRL's defaults."""
    keys = {cache.file_key(path.read_bytes(), False) for path in shipped_model_configs().values()}
    return keys | {cache.trl_defaults_key()}


def exercise(plans: DocPlans, fit: FitFunction) -> dict[str, tuple[str, str]]:
    """Plan what the shipped cache serves: every GPU recipe on its header's launch as the command prints it (the
    report, and the changes that fit when it does not), and the docs' blocks, which it returns."""
    for stem in plans.recipes():
        plan = plans.plan(stem)
        report(plan)
        if plan.fits is False:
            suggestions(plan)
    return render_blocks(plans, fit)


def regenerate(fit: FitFunction, root: Path | None = None) -> int:
    """Trace afresh (the cache off: neither the disk's entries nor the old shipped ones are read), then replace
    the shipped files with the shipped keys' entries, removing the stale ones."""
    os.environ[cache.ENV] = "off"
    cache.clear_memory()
    exercise(DocPlans(root), fit)
    entries = cache.kept(shipped_keys())
    removed = cache.write_shipped(entries)
    count = sum(len(values) for values in entries.values())
    print(
        f"wrote {count} entries of {len(entries)} keys to {cache.SHIPPED}"
        + (f"; removed {', '.join(removed)}" if removed else "")
    )
    return 0
