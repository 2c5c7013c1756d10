"""Auto-fit: the cheapest combination of changes that keep a step's mathematics and make its plan fit a device.

Of the planner's changes (:func:`video_grpo.plan.fitting.alternatives`), these leave every optimizer step as it
was, to floating-point rounding:

- ``micro-batch``: half the micro-batch, twice the accumulation and twice ``steps_per_generation``, so the
  generation batch and the optimizer batch stay as they were (TRL would otherwise derive a smaller generation batch
  from the smaller micro-batch). Exact only where TRL's step does not depend on the split
  (:func:`~video_grpo.plan.loss_split.micro_batch_refusal`): every loss but ``bnpo``, with neither the entropy bonus
  nor ``top_entropy_quantile < 1``, which are computed over each micro-batch's own tokens;
- ``checkpointing``: activations recomputed in backward;
- ``offload``: the optimizer's states and the parameters in CPU RAM (DeepSpeed ZeRO-3, ``zero3_offload.yaml``);
- ``no-gather``: under ZeRO-3, generation gathers one layer at a time (``ds3_gather_for_generation: false``).
  Never with ``decode_compile: true`` (the trainer refuses that pair); under ``auto`` it turns compiled decoding
  off, and the change's text, ``auto_fit.json`` (``decode_path``) and the log say so.

A running process can change only its own arguments: the micro-batch, checkpointing and the gathering are
``GRPOConfig`` fields (:data:`IN_PROCESS`), while offload and ZeRO-3 are the accelerate config's, fixed at launch
(:data:`AT_LAUNCH`). :func:`auto_fit` applies in-process changes only; when none fits, the run must stop, and
:attr:`FitResult.message` lists what would fit (at launch, or by changing what is learned) with its planned peak.

Combinations are tried in the planner's cost order: fewest changes first (each halving of the micro-batch counts
as one), then the cheapest by their rank in :func:`~video_grpo.plan.fitting.alternatives`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from video_grpo.plan.fitting import alternatives, fitting_combinations
from video_grpo.plan.loss_split import LossSettings, micro_batch_refusal
from video_grpo.plan.recipe import GB, Plan, make_plan
from video_grpo.plan.workload import Workload, decode_path

if TYPE_CHECKING:
    from video_grpo.plan.ranks import RankDevices

MATH_PRESERVING = ("checkpointing", "micro-batch", "zero3", "offload", "no-gather")
IN_PROCESS = ("checkpointing", "micro-batch", "no-gather")
AT_LAUNCH = ("zero3", "offload")
MAX_HALVINGS = 6


def run_fields(work: Workload) -> dict[str, Any]:
    """The ``GRPOConfig`` fields a workload's in-process settings come from."""
    return {
        "per_device_train_batch_size": work.micro_batch_rows,
        "gradient_accumulation_steps": work.gradient_accumulation,
        "steps_per_generation": work.generation_rows // work.micro_batch_rows,
        "gradient_checkpointing": work.gradient_checkpointing,
        "ds3_gather_for_generation": work.gather_for_generation,
    }


@dataclass
class FitResult:
    """What auto-fit found for a plan: the fitted plan and its changes, or why nothing in-process fits."""

    before: Plan
    after: Plan | None  # None: no in-process combination that keeps the math fits
    changes: list[str] = field(default_factory=list)  # the planner's words for each change applied
    excluded: list[str] = field(default_factory=list)  # changes not tried here, and why
    elsewhere: list[tuple[str, float, bool]] = field(default_factory=list)  # (change, peak, keeps the math)
    ranks: RankDevices | None = None  # every rank's device, and the one all fitted for (plan.ranks)

    @property
    def fits(self) -> bool:
        return self.after is not None

    @property
    def fields(self) -> dict[str, Any]:
        """The ``GRPOConfig`` fields to set (only those that change)."""
        if self.after is None:
            return {}
        before, after = run_fields(self.before.work), run_fields(self.after.work)
        return {name: value for name, value in after.items() if before[name] != value}

    def as_json(self) -> dict:
        before = run_fields(self.before.work)
        changed = self.fields
        work = self.before.work
        return {
            "device": self.before.gpu["name"],
            "device_memory_gb": round(self.before.gpu["memory_gb"], 3),
            "ranks": self.ranks.as_json() if self.ranks else None,
            "usable_gb": round(self.before.usable_bytes / GB, 3),
            "planned_peak_gb_before": round(self.before.memory.peak / GB, 3),
            "planned_peak_gb_after": round(self.after.memory.peak / GB, 3) if self.after else None,
            "fits_before": bool(self.before.fits),
            "fits_after": bool(self.after.fits) if self.after else False,
            "before": {name: before[name] for name in changed},
            "after": changed,
            "changes": self.changes,
            # what must not move: answers generated per process at once, and answers per optimizer step
            "generation_rows_per_process": work.generation_rows,
            # how generation decodes on the device, before and after (plan.workload.decode_path)
            "decode_path": {
                "before": decode_path(work),
                "after": decode_path(self.after.work) if self.after else None,
            },
            "rows_per_optimizer_step_per_process": work.micro_batch_rows * work.gradient_accumulation,
            "excluded": self.excluded,
            "other_changes_that_fit": [
                {"change": change, "peak_gb": round(peak / GB, 3), "keeps_the_math": keeps}
                for change, peak, keeps in self.elsewhere
            ],
        }

    def summary(self) -> str:
        """One line for the log."""
        usable = self.before.usable_bytes / GB
        peak = self.before.memory.peak / GB
        if not self.changes and self.after is not None:
            return (
                f"auto_fit: the plan fits as it is ({peak:.2f} GB of {usable:.2f} GB usable); nothing changed"
                + self.ranks_note()
            )
        if self.after is None:
            return self.message()
        return (
            f"auto_fit: {'; '.join(self.changes)}. Planned peak {peak:.2f} GB -> {self.after.memory.peak / GB:.2f} "
            f"GB ({usable:.2f} GB usable on {self.before.gpu['name']}); the generation batch "
            f"({self.before.work.generation_rows} rows per process) and the optimizer batch "
            f"({self.before.work.micro_batch_rows * self.before.work.gradient_accumulation} rows per process) "
            "are unchanged" + self.ranks_note()
        )

    def ranks_note(self) -> str:
        """How the device was chosen among a launch's ranks (:mod:`video_grpo.plan.ranks`); empty for one."""
        words = self.ranks.words() if self.ranks else ""
        return f"; {words}" if words else ""

    def message(self) -> str:
        """Why the run stops: no in-process change that keeps the math fits; what would, with its peak."""
        lines = [
            f"auto_fit: no change that keeps the mathematics fits {self.before.gpu['name']} "
            f"({self.before.usable_bytes / GB:.2f} GB usable; planned peak "
            f"{self.before.memory.peak / GB:.2f} GB in {self.before.memory.peak_phase}{self.ranks_note()}). The "
            "run stops before the model loads."
        ]
        if self.excluded:
            lines.append("not tried: " + "; ".join(self.excluded))
        launch = [(c, p) for c, p, keeps in self.elsewhere if keeps]
        other = [(c, p) for c, p, keeps in self.elsewhere if not keeps]
        if launch:
            lines.append("these keep the mathematics but need another launch (an accelerate config):")
            lines += [f"  - {change}: peak {peak / GB:.2f} GB" for change, peak in launch]
        if other:
            lines.append("these fit but change the mathematics of a step (never applied automatically):")
            lines += [f"  - {change}: peak {peak / GB:.2f} GB" for change, peak in other]
        if not launch and not other:
            lines.append("no change or combination the planner tries fits; plan a larger device")
        return "\n".join(lines)


def apply_kinds(work: Workload, kinds: list[str]) -> tuple[Workload, list[str]] | None:
    """``work`` with each kind applied in turn as :func:`alternatives` models it, and the changes' words; None
    when a kind does not apply (e.g. a micro-batch of 1 cannot be halved)."""
    names: list[str] = []
    previous = None
    for kind in kinds:
        option = next(((change, new) for k, change, new in alternatives(work) if k == kind), None)
        if option is None:
            return None
        if kind == previous == "micro-batch":  # halved again: one change, to the last micro-batch
            names.pop()
        names.append(option[0])
        work, previous = option[1], kind
    return work, names


def excluded_kinds(work: Workload, loss: LossSettings | str) -> dict[str, str]:
    """In-process kinds that would change the mathematics of this run, with the reason. ``loss``: the run's loss
    settings (:class:`~video_grpo.plan.loss_split.LossSettings`), or its ``loss_type`` alone with TRL's defaults."""
    reasons = {}
    if work.decode_compile == "true":
        reasons["no-gather"] = (
            "layer-by-layer gathering (ds3_gather_for_generation: false): decode_compile is true, and a compiled "
            "decode step needs the whole policy on each rank (decode_compile: auto allows it and decodes eagerly)"
        )
    refusal = micro_batch_refusal(loss)
    if refusal is not None:
        reasons["micro-batch"] = f"a smaller micro-batch: {refusal}"
    return reasons


def auto_fit(plan: Plan, loss: LossSettings | str, unavailable: dict[str, str] | None = None) -> FitResult:
    """The cheapest in-process combination of math-preserving changes that makes ``plan`` fit its device
    (``plan.gpu``, which must be set). When none does, the result lists the planner's other changes that fit.
    ``loss``: the run's loss settings (:meth:`LossSettings.of` its ``GRPOConfig`` or recipe), or a ``loss_type``
    alone. ``unavailable``: kinds the caller cannot apply, with the reason."""
    if plan.gpu is None:
        raise ValueError("auto_fit needs a device to fit: a GPU, or auto_fit_memory_gb")
    if plan.fits:
        return FitResult(plan, plan)
    reasons = {**excluded_kinds(plan.work, loss), **(unavailable or {})}
    offered = [kind for kind, _, _ in alternatives(plan.work)]
    rank = {kind: index for index, kind in enumerate(offered)}
    once = [kind for kind in IN_PROCESS if kind in rank and kind != "micro-batch" and kind not in reasons]
    halvings = 0
    if "micro-batch" in rank and "micro-batch" not in reasons:
        rows = plan.work.micro_batch_rows
        while rows % 2 == 0 and rows > 1 and halvings < MAX_HALVINGS:
            rows, halvings = rows // 2, halvings + 1
    candidates = []
    for size in range(len(once) + 1):
        for subset in itertools.combinations(once, size):
            for halved in range(halvings + 1):
                if not subset and not halved:
                    continue
                cost = (
                    size + halved,
                    sum(rank[k] for k in subset) + halved * rank.get("micro-batch", 0),
                    halved,
                )
                kinds = sorted(subset, key=rank.get) + ["micro-batch"] * halved
                candidates.append((cost, kinds))
    for _, kinds in sorted(candidates, key=lambda c: c[0]):
        applied = apply_kinds(plan.work, kinds)
        if applied is None:
            continue
        work, names = applied
        new = make_plan(plan.shape, work, plan.gpu)
        if new.fits:
            return FitResult(plan, new, changes=names, excluded=list(reasons.values()))
    elsewhere = [
        (change, peak, all(kind in MATH_PRESERVING and kind not in reasons for kind in kinds))
        for kinds, change, peak in fitting_combinations(plan, limit=8)
    ]
    return FitResult(plan, None, excluded=list(reasons.values()), elsewhere=elsewhere)
