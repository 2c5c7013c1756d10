"""The planner: a recipe's memory per GPU and time per step, before renting GPUs (``python -m video_grpo.plan``).

Modules, in the order a plan is made (each imports only those above it):

- :mod:`~video_grpo.plan.cache`: what depends only on the model and widths, kept in-process and on disk (a plan
  made before from the same model, source and versions skips the meta model and the traces);
- :mod:`~video_grpo.plan.workload`: what a recipe asks of one GPU's step (worst-case video, group, launch);
- :mod:`~video_grpo.plan.model`: an architecture's shape and exact parameter counts, from ``config.json``;
- :mod:`~video_grpo.plan.sizes`: the step's token and row counts;
- :mod:`~video_grpo.plan.fake_trace`, :mod:`~video_grpo.runtime.live_memory`: running model code on fake tensors,
  and counting live tensor bytes;
- :mod:`~video_grpo.plan.layers`: one layer's activation bytes, traced at the real sizes;
- :mod:`~video_grpo.plan.memory`: the step walked phase by phase, bytes per category;
- :mod:`~video_grpo.plan.compute`: FLOPs per phase, the GPU table, seconds per phase;
- :mod:`~video_grpo.plan.recipe`: a recipe's :class:`Plan` and its verdict;
- :mod:`~video_grpo.plan.fitting`: the changes that would make it fit;
- :mod:`~video_grpo.plan.ranks`: the one device every rank of a launch fits for, the smallest among them;
- :mod:`~video_grpo.plan.loss_split`: whether TRL's step depends on how the rows are split into micro-batches;
- :mod:`~video_grpo.plan.autofit`: the cheapest of them that keep the mathematics, which a run applies itself
  (``auto_fit: true``);
- :mod:`~video_grpo.plan.report`: the printed report;
- :mod:`~video_grpo.plan.doc_blocks`, :mod:`~video_grpo.plan.doc_tables`, :mod:`~video_grpo.plan.doc_example`,
  :mod:`~video_grpo.plan.docs`: the tables and the worked example of README.md and docs/planning.md, written or
  checked by ``python -m video_grpo.plan --markdown``;
- :mod:`~video_grpo.plan.cli`: the command;
- :mod:`~video_grpo.plan.startup`: the one-line plan a training run logs, its auto-fit and the plan its plan check
  compares with (the trainer's entry point; :mod:`~video_grpo.runtime.live_memory` is the CPU plan check's counter).
"""

from video_grpo.plan.cli import main
from video_grpo.plan.fitting import alternatives, suggestions
from video_grpo.plan.recipe import GB, HEADROOM, Plan, make_plan, plan_recipe, resolve_gpu
from video_grpo.plan.report import report
from video_grpo.plan.startup import log_startup_plan, startup_plan

__all__ = [
    "GB",
    "HEADROOM",
    "Plan",
    "alternatives",
    "log_startup_plan",
    "main",
    "make_plan",
    "plan_recipe",
    "report",
    "resolve_gpu",
    "startup_plan",
    "suggestions",
]
