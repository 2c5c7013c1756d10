"""The shipped recipes' tables in README.md and docs/planning.md, made from their plans.

The rows are every GPU recipe in ``configs/grpo/`` (one whose model is a Hub id with a shipped config,
``configs/models/index.json``), planned on the launch its ``# Plan:`` header names, as ``python -m video_grpo.plan``
plans it. :data:`LABELS` names and orders the rows; a recipe it does not list gets a row named after its model, after
the others, so a new preset appears in every table when they are regenerated (one line in :data:`LABELS` names it).
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import yaml

from video_grpo.plan.autofit import FitResult, apply_kinds
from video_grpo.plan.compute import GPUS
from video_grpo.plan.fitting import fitting_combinations
from video_grpo.plan.model import shipped_model_configs
from video_grpo.plan.recipe import GB, Plan, make_plan, plan_recipe, resolve_gpu
from video_grpo.plan.workload import decode_path

RECIPES = "configs/grpo"
DEFAULT_LAUNCH = "configs/accelerate/zero3.yaml"
PLAN_HEADER = re.compile(
    r"^# Plan: fits (?P<gpus>[\w, -]+) with (?P<launch>configs/accelerate/\S+\.yaml)", re.M
)
LABELS = {  # recipe -> its name in the tables, in the tables' order
    "qwen2_5_vl_3b_charades": "Qwen2.5-VL-3B",
    "qwen2_5_vl_7b_charades": "Qwen2.5-VL-7B",
    "qwen3_vl_4b_charades": "Qwen3-VL-4B",
    "qwen3_vl_8b_charades": "Qwen3-VL-8B",
    "qwen3_5_4b_charades": "Qwen3.5-4B",
    "timezero_qwen2_5_vl_7b_charades": "TimeZero 7B",
    "time_r1_qwen2_5_vl_7b_charades": "Time-R1 7B",
    "tempsamp_r1_qwen2_5_vl_7b_charades": "TempSamp-R1 7B",
    "timelens_qwen2_5_vl_7b": "TimeLens-7B",
    "timelens_qwen3_vl_8b": "TimeLens-8B",
    "timelens2_qwen3_vl_4b": "TimeLens2-4B",
    "timelens2_qwen3_vl_8b": "TimeLens2-8B",
}
PLANNED_ON = "h100-80gb"  # the GPU a recipe's base plan is made for (memory does not depend on it)
STEP_TIME_GPUS = ("h100-80gb", "h200-141gb")  # the fit tables' step times: an 80 GB and a 141 GB card
SETTINGS_RECIPES = ("qwen2_5_vl_7b_charades", "qwen3_vl_8b_charades")
# the settings table keeps the 8 GPUs and the recipe's video: more GPUs change the optimizer batch, fewer visual
# tokens what the model sees
SETTINGS_LEFT_OUT = ("gpus", "tokens")
SETTINGS_PER_CELL = 3
PHASE_NAMES = {
    "generation": "generation",
    "old_and_reference": "old policy + reference",
    "loss": "loss",
    "optimizer": "optimizer",
}
# what a run's auto-fit applies to a plan and a recipe file (video_grpo.plan.cli passes its own, so the docs show
# what the command prints)
FitFunction = Callable[[Plan, str], FitResult]


def repository_root() -> Path:
    """The checkout this package is in (``pip install -e .``), or else the working directory."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / RECIPES).is_dir() else Path.cwd()


def model_label(model: str) -> str:
    """A row's name from its Hub id: ``Qwen/Qwen3-VL-4B-Instruct`` -> ``Qwen3-VL-4B``."""
    return model.rpartition("/")[2].removesuffix("-Instruct")


class DocPlans:
    """Each GPU recipe's plan, made once and reused for every table (another GPU or a changed workload reuses the
    recipe's model shape, whose layer traces the planner caches)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or repository_root()
        self._plans: dict[str, Plan] = {}

    def path(self, stem: str) -> Path:
        return self.root / RECIPES / f"{stem}.yaml"

    def model(self, stem: str) -> str | None:
        return (yaml.safe_load(self.path(stem).read_text()) or {}).get("model_name_or_path")

    def recipes(self) -> list[str]:
        """The GPU recipes, in the tables' order."""
        shipped = shipped_model_configs()
        found = sorted(p.stem for p in (self.root / RECIPES).glob("*.yaml"))
        gpu = [stem for stem in found if self.model(stem) in shipped]
        order = list(LABELS)
        return sorted(gpu, key=lambda s: (order.index(s) if s in order else len(order), s))

    def launch(self, stem: str) -> str:
        header = PLAN_HEADER.search(self.path(stem).read_text())
        return header["launch"] if header else DEFAULT_LAUNCH

    def plan(self, stem: str) -> Plan:
        """``python -m video_grpo.plan --config RECIPE --accelerate_config LAUNCH --gpu h100-80gb``."""
        if stem not in self._plans:
            self._plans[stem] = plan_recipe(str(self.path(stem)), self.launch(stem), gpu=PLANNED_ON)
        return self._plans[stem]

    def on(self, stem: str, gpu: str) -> Plan:
        plan = self.plan(stem)
        return make_plan(plan.shape, plan.work, resolve_gpu(gpu, None))

    def off(self, stem: str) -> Plan:
        """The recipe with ``shared_prefix`` and encode-once off."""
        plan = self.plan(stem)
        return make_plan(plan.shape, plan.work.replace(shared_prefix=False, encode_once=False), plan.gpu)

    def label(self, stem: str) -> str:
        label = f"{LABELS.get(stem) or model_label(self.model(stem) or stem)} `{stem}`"
        if self.launch(stem) != DEFAULT_LAUNCH:
            work = self.plan(stem).work
            label += f", ZeRO-{work.zero_stage}" + (" offload" if work.offload_optimizer else "")
        return label


PAGE_WIDTH = 116  # the docs' prose is wrapped at this width


def wrap(paragraph: str) -> str:
    """A paragraph (or a ``- `` bullet, with its hanging indent) wrapped as the docs' prose is."""
    indent = "  " if paragraph.startswith("- ") else ""
    return textwrap.fill(
        paragraph, PAGE_WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def gb(value: float, digits: int = 1) -> str:
    return f"{value / GB:.{digits}f} GB"


def fits_text(plan: Plan) -> str:
    """The GPU classes of :data:`GPUS` a plan fits: ``40 GB and up`` (a fit depends on the card's memory only)."""
    fitting = [name for name in GPUS if dataclasses.replace(plan, gpu=resolve_gpu(name, None)).fits]
    if not fitting:
        return "none"
    return f"{min(GPUS[name]['memory_gb'] for name in fitting):g} GB and up"


def step_seconds(plans: DocPlans, stem: str, gpu: str) -> float:
    return sum(plans.on(stem, gpu).seconds.values())


def time_header(gpu: str) -> str:
    return f"step, {GPUS[gpu]['name'].split()[0]} {GPUS[gpu]['memory_gb']:g} GB"


def readme_fit_table(plans: DocPlans) -> str:
    """README's "Will it fit?": peak per GPU, the cards it fits, and seconds per step on an 80 GB and a 141 GB card,
    as shipped; the peak with ``shared_prefix`` and encode-once off."""
    lines = [
        "| recipe | peak per GPU | fits | "
        + " | ".join(time_header(gpu) for gpu in STEP_TIME_GPUS)
        + " | off: peak | off: fits |",
        "|---|---|---|" + "---|" * len(STEP_TIME_GPUS) + "---|---|",
    ]
    for stem in plans.recipes():
        plan, off = plans.plan(stem), plans.off(stem)
        times = " | ".join(f"{step_seconds(plans, stem, gpu):.2f} s" for gpu in STEP_TIME_GPUS)
        lines.append(
            f"| {plans.label(stem)} | {gb(plan.memory.peak)} | {fits_text(plan)} | {times} | "
            f"{gb(off.memory.peak)} | {fits_text(off)} |"
        )
    return "\n".join(lines)


def breakdown(plan: Plan, digits: int = 1, share: float = 0.05) -> str:
    """The categories of a plan's peak phase above ``share`` of the peak, largest first."""
    work, memory = plan.work, plan.memory
    gathered = memory.peak_phase == "generation" and work.zero_stage == 3 and work.gather_for_generation
    words = {
        "weights": "of weights gathered whole for generation" if gathered else "of weights",
        "optimizer states": "of optimizer states",
        "kv cache": "of KV cache",
        "reference": "of the reference's shard" if work.zero_stage == 3 else "of the reference copy",
    }
    parts = sorted(memory.phases[memory.peak_phase].by_category.items(), key=lambda item: -item[1])
    return join_words(
        [
            f"{gb(size, digits)} {words.get(name, 'of ' + name)}"
            for name, size in parts
            if size > share * memory.peak
        ]
    )


def join_words(items: list[str], last: str = "and") -> str:
    """``a``, ``a and b``, ``a, b, and c``."""
    if len(items) < 3:
        return f" {last} ".join(items)
    return ", ".join(items[:-1]) + f", {last} " + items[-1]


def recipe_table(plans: DocPlans) -> str:
    """docs/planning.md's recipe table (each peak with its phase), and what the 7B recipe's peak is made of."""
    lines = [
        "| recipe | peak per GPU (phase) | fits | off: peak (phase) | off: fits |",
        "|---|---|---|---|---|",
    ]
    for stem in plans.recipes():
        plan, off = plans.plan(stem), plans.off(stem)
        lines.append(
            f"| {plans.label(stem)} | {gb(plan.memory.peak)} ({PHASE_NAMES[plan.memory.peak_phase]}) | "
            f"{fits_text(plan)} | {gb(off.memory.peak)} ({PHASE_NAMES[off.memory.peak_phase]}) | "
            f"{fits_text(off)} |"
        )
    stem = SETTINGS_RECIPES[0]
    plan = plans.plan(stem)
    work, states = plan.work, plan.memory.phases[plan.memory.peak_phase].by_category["optimizer states"]
    per_parameter = states * work.num_processes / plan.shape.params
    lines += [
        "",
        wrap(
            f"At the peak of `{stem}` ({PHASE_NAMES[plan.memory.peak_phase]}): {breakdown(plan)}. The optimizer "
            f"states are {per_parameter:.0f} B for each of the {plan.shape.params / 1e9:.2f}B parameters, over "
            f"{work.num_processes} GPUs."
        ),
    ]
    return "\n".join(lines)


def recipe_times(plans: DocPlans) -> str:
    """docs/planning.md's seconds per phase on an H100, and per step on each of :data:`STEP_TIME_GPUS`."""
    lines = [
        "| recipe | generation | old policy + reference | loss fwd + bwd | "
        + " | ".join(time_header(gpu) for gpu in STEP_TIME_GPUS)
        + " |",
        "|---|---|---|---|" + "---|" * len(STEP_TIME_GPUS),
    ]
    for stem in plans.recipes():
        plan = plans.on(stem, STEP_TIME_GPUS[0])
        seconds = plan.seconds
        old = f"{seconds['old_and_reference']:.2f}"
        if plan.flops["old_and_reference"] == 0:
            old = f"0 (β = {plan.work.beta:g}, one pass)"
        times = " | ".join(f"{step_seconds(plans, stem, gpu):.2f}" for gpu in STEP_TIME_GPUS)
        lines.append(
            f"| {plans.label(stem)} | {seconds['generation']:.2f} | {old} | {seconds['loss']:.2f} | {times} |"
        )
    return "\n".join(lines)


OVERRIDES = {  # how a change of video_grpo.plan.fitting.alternatives is made: a flag, a launch or a setting
    "checkpointing": lambda work: "`--activation_checkpointing true`",
    "micro-batch": lambda work: (
        f"`--per_device_train_batch_size {work.micro_batch_rows} --gradient_accumulation_steps "
        f"{work.gradient_accumulation} --steps_per_generation {work.generation_rows // work.micro_batch_rows}`"
    ),
    "zero3": lambda work: "`configs/accelerate/zero3.yaml`",
    "gpus": lambda work: f"{work.num_processes} GPUs",
    "offload": lambda work: "`configs/accelerate/zero3_offload.yaml`",
    "no-gather": lambda work: "`--ds3_gather_for_generation false`",
    "frozen": lambda work: "`--freeze_vision_tower true`",
    "lora": lambda work: "LoRA",
    "tokens": lambda work: f"`--video_max_tokens {work.visual_tokens}`",
}


def describe_change(plan: Plan, kinds: tuple[str, ...], peak: float) -> str:
    """A change of the planner's as the settings table shows it: the overrides, the new peak, and what it costs."""
    applied = apply_kinds(plan.work, list(kinds))
    if applied is None:
        raise ValueError(f"{kinds}: the planner offered this combination but it does not apply")
    work, _ = applied
    notes = [gb(peak)]
    if "no-gather" in kinds:
        slower = "slower"
        if decode_path(plan.work) != "eager" and decode_path(work) == "eager":
            slower += ", eager generation: compiled decoding off"
        notes.append(slower)
    return f"{' + '.join(OVERRIDES[kind](work) for kind in kinds)} ({'; '.join(notes)})"


def settings_cell(plan: Plan) -> str:
    if plan.fits:
        return f"as shipped ({gb(plan.memory.peak)})"
    found = [
        describe_change(plan, kinds, peak)
        for kinds, _, peak in fitting_combinations(plan, limit=4 * SETTINGS_PER_CELL)
        if not set(kinds) & set(SETTINGS_LEFT_OUT)
    ][:SETTINGS_PER_CELL]
    return ", or ".join(found) or "none of the planner's changes fits (plan a larger card)"


def settings_table(plans: DocPlans) -> str:
    """docs/planning.md's settings per GPU class: as shipped where it fits, else the first changes the planner
    lists that keep 8 GPUs and the video (:data:`SETTINGS_LEFT_OUT`), each with its peak. Classes with the same
    cells share a row."""
    lines = [
        "| card | " + " | ".join(f"`{stem}`" for stem in SETTINGS_RECIPES) + " |",
        "|---|" + "---|" * len(SETTINGS_RECIPES),
    ]
    rows: list[tuple[list[float], list[str], list[str]]] = []
    for memory in sorted({gpu["memory_gb"] for gpu in GPUS.values()}, reverse=True):
        names = [name for name, gpu in GPUS.items() if gpu["memory_gb"] == memory]
        cells = [settings_cell(plans.on(stem, names[0])) for stem in SETTINGS_RECIPES]
        if rows and rows[-1][2] == cells:
            rows[-1][0].append(memory)
            rows[-1][1].extend(names)
        else:
            rows.append(([memory], names, cells))
    for memories, names, cells in rows:
        card = ", ".join(f"{m:g} GB" for m in memories) + " (" + ", ".join(f"`{n}`" for n in names) + ")"
        lines.append(f"| {card} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
