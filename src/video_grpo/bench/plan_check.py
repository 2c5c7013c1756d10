"""``python -m video_grpo.bench plan [--quick]``: the planner (``video_grpo.plan``) against measured steps.

Each cell of a grid is one GRPO step measured by :mod:`video_grpo.bench.plan_measure` (the project's code on fake
weights at full width, live tensor bytes and FlopCounterMode FLOPs per phase) and planned by
``video_grpo.plan.memory`` / ``video_grpo.plan.compute`` with ``device="cpu"`` (the CPU kernels it runs). Rows:

- ``plan_cell``: one per cell, the planned and measured peak (GB), the ratio, each phase's and each category's
  ratio, and FLOPs per phase;
- ``plan_grid_peak``, ``plan_grid_flops``, ``plan_grid_categories``: the share of cells within the goals (peak
  +-10%, FLOPs +-5% in every phase, every category above 2% of the peak +-15% at the measured peak phase);
- ``plan_full_depth``: whole steps traced at the published 3B and 7B depths (36 / 28 text layers, 32 vision),
  planned vs measured.

The grid covers, one or two factors at a time around a base cell: Qwen2.5-VL, Qwen3-VL and Qwen3.5; the published
3B/7B (Qwen3-VL: 4B/8B) widths at depth 1 and 2, Qwen3.5-4B's at 3 Gated DeltaNet layers and 1 attention layer; 1k, 2k and 4k visual tokens; G = 4 and 8; shared prompt on and off;
gradient checkpointing on and off; full training, LoRA and a frozen tower; fp32 and bf16; beta 0 and 0.04.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from video_grpo.bench.emit import emit
from video_grpo.bench.plan_measure import StepSetting, build_config, measure_step, plan_categories, video_grid
from video_grpo.bench.qwen_widths import published_config
from video_grpo.inputs.families import detect_family
from video_grpo.plan.compute import plan_compute
from video_grpo.plan.memory import plan_memory
from video_grpo.plan.model import read_model_shape
from video_grpo.plan.prompt_text import TIME_TEXT_TOKENS
from video_grpo.plan.workload import Workload

MODELS = Path(__file__).resolve().parents[3] / "configs" / "models"
QWEN3_VL = {"4b": "qwen3_vl_4b_instruct.json", "8b": "qwen3_vl_8b_instruct.json"}
QWEN3_5 = {"3.5-4b": "qwen3_5_4b.json"}  # depth d: d Gated DeltaNet layers + 1 full-attention layer
PEAK_GOAL, FLOPS_GOAL, CATEGORY_GOAL = 0.10, 0.05, 0.15
CATEGORY_FLOOR = 0.02  # categories under this share of the peak are not held to the category goal


def model_values(widths: str, depth: int | None) -> dict:
    """A published config's values with the text and vision depth cut to ``depth`` (None: full depth)."""
    if widths in QWEN3_VL:
        values = json.loads((MODELS / QWEN3_VL[widths]).read_text())
        values.pop("architectures", None)
        values.pop("transformers_version", None)
        if depth is not None:
            values["text_config"]["num_hidden_layers"] = depth
            values["vision_config"]["depth"] = depth
            values["vision_config"]["deepstack_visual_indexes"] = [0]
        return values
    if widths in QWEN3_5:
        values = json.loads((MODELS / QWEN3_5[widths]).read_text())
        values.pop("architectures", None)
        if depth is not None:
            text = values["text_config"]
            text["layer_types"] = ["linear_attention"] * depth + ["full_attention"]
            text["num_hidden_layers"] = depth + 1
            values["vision_config"]["depth"] = depth
        return values
    values = copy.deepcopy(published_config(widths)[0])
    if depth is not None:
        values["num_hidden_layers"] = depth
        values["vision_config"]["depth"] = depth
        values["vision_config"]["fullatt_block_indexes"] = [depth - 1]
    return values


def workload(setting: StepSetting, config) -> Workload:
    """The planner's workload for a measured step (same tokens, rows and settings, one process)."""
    family = detect_family(config)
    t, h, w = video_grid(setting.visual_tokens, config.vision_config.spatial_merge_size)
    around_video = t * (TIME_TEXT_TOKENS + 2) if family.time_in_text else 2
    return Workload(
        visual_tokens=setting.visual_tokens,
        temporal_patches=t,
        frame_tokens=h * w // config.vision_config.spatial_merge_size**2,
        text_tokens=setting.text_tokens + around_video,
        completion_tokens=setting.answer_tokens,
        group_size=setting.group_size,
        micro_batch_rows=setting.group_size,
        generation_rows=setting.group_size,
        shared_prefix=setting.shared_prefix,
        gradient_checkpointing=setting.gradient_checkpointing,
        training=setting.training,
        lora_rank=setting.lora_rank if setting.training == "lora" else 0,
        lora_targets=setting.lora_targets,
        beta=setting.beta,
        old_policy_pass=setting.old_policy_pass,
        dtype=setting.dtype,
        mixed_precision=False,
    )


def compare(widths: str, depth: int | None, **settings) -> dict:
    """Plan and measure one cell; the ratios (planned / measured)."""
    values = model_values(widths, depth)
    setting = StepSetting(config=values, **settings)
    config = build_config(values)
    shape = read_model_shape(config)
    work = workload(setting, config)
    started = time.perf_counter()
    plan, flops = plan_memory(shape, work, "cpu"), plan_compute(shape, work, "cpu").flops
    measured = measure_step(setting)
    seconds = time.perf_counter() - started
    measured_phase = max(measured.peaks, key=lambda k: measured.peaks[k].bytes)
    measured_peak = measured.peaks[measured_phase].bytes
    phases, categories, flop_ratios = {}, {}, {}
    for name, phase in plan.phases.items():
        phases[name] = round(phase.peak / measured.peaks[name].bytes, 4)
        if measured.flops[name]:
            flop_ratios[name] = round(flops[name] / measured.flops[name], 4)
    # categories at the step's peak, the moment that decides whether a run fits (within a phase, two moments of
    # nearly equal size can hold different mixes)
    planned_categories = plan.phases[measured_phase].by_category
    measured_categories = plan_categories(measured.peaks[measured_phase].by_kind)
    for category in set(planned_categories) | set(measured_categories):
        planned, seen = planned_categories.get(category, 0), measured_categories.get(category, 0)
        if max(planned, seen) >= CATEGORY_FLOOR * measured_peak:
            categories[category] = round(planned / seen, 4) if seen else None
    return {
        "cell": {"widths": widths, "depth": depth or "full", **settings},
        "planned_gb": round(plan.peak / 1e9, 4),
        "measured_gb": round(measured_peak / 1e9, 4),
        "peak_ratio": round(plan.peak / measured_peak, 4),
        "phase": plan.peak_phase,
        "measured_phase": measured_phase,
        "phase_ratios": phases,
        "category_ratios": categories,
        "flops_ratios": flop_ratios,
        "seconds": round(seconds, 1),
    }


def grid(quick: bool) -> list[tuple[str, int | None, dict]]:
    """(widths, depth, settings) cells: a base and one or two factors changed at a time."""
    base = {"visual_tokens": 2048, "group_size": 8, "answer_tokens": 128}
    if quick:
        base = {"visual_tokens": 512, "group_size": 4, "answer_tokens": 32}
        return [
            ("narrow", 1, base),
            ("narrow", 1, {**base, "shared_prefix": False}),
            ("narrow", 1, {**base, "gradient_checkpointing": True}),
            ("narrow", 1, {**base, "training": "lora", "beta": 0.04}),
            ("narrow", 1, {**base, "training": "frozen_tower", "dtype": "float32", "old_policy_pass": True}),
            # few tokens, checkpointed, float32: the step peaks in the input embedding's backward (its dense
            # gradient, and tied to the head, their sum), after the tower's gradients
            (
                "narrow",
                2,
                {
                    "visual_tokens": 64,
                    "group_size": 2,
                    "answer_tokens": 8,
                    "gradient_checkpointing": True,
                    "dtype": "float32",
                },
            ),
        ]
    cells = [(widths, depth, base) for widths in ("3b", "7b", "4b", "8b") for depth in (1, 2)]
    for widths in ("3b", "4b"):
        cells += [
            (widths, 1, {**base, "visual_tokens": 1024}),
            (widths, 1, {**base, "visual_tokens": 4096}),
            (widths, 1, {**base, "group_size": 4}),
            (widths, 1, {**base, "shared_prefix": False}),
            (widths, 1, {**base, "gradient_checkpointing": True}),
            (widths, 1, {**base, "training": "lora"}),
            (widths, 1, {**base, "training": "frozen_tower"}),
            (widths, 1, {**base, "dtype": "float32"}),
            (widths, 1, {**base, "beta": 0.04}),
            (widths, 1, {**base, "beta": 0.04, "training": "lora"}),
            (widths, 1, {**base, "old_policy_pass": True, "gradient_checkpointing": True}),
        ]
    cells += [
        ("7b", 2, {**base, "visual_tokens": 4096, "gradient_checkpointing": True, "beta": 0.04}),
        (
            "7b",
            1,
            {**base, "visual_tokens": 1024, "group_size": 4, "shared_prefix": False, "dtype": "float32"},
        ),
        (
            "8b",
            2,
            {**base, "training": "frozen_tower", "gradient_checkpointing": True, "visual_tokens": 4096},
        ),
        ("8b", 1, {**base, "training": "lora", "shared_prefix": False, "group_size": 4}),
        ("3b", 2, {**base, "training": "lora", "gradient_checkpointing": True, "beta": 0.04}),
        ("4b", 2, {**base, "dtype": "float32", "gradient_checkpointing": True, "visual_tokens": 1024}),
        ("3.5-4b", 3, base),  # three Gated DeltaNet layers forked after the prompt, one attention layer
        ("3.5-4b", 3, {**base, "gradient_checkpointing": True}),
    ]
    return cells


def within(ratio: float | None, goal: float) -> bool:
    return ratio is not None and abs(ratio - 1) <= goal


def plan_rows(quick: bool = False, full_depth: bool = True, cells: slice | None = None) -> None:
    """Emit one row per cell, the grid's summary rows, and (unless ``quick``) the full-depth rows. ``cells``: a
    slice of the grid (to split a run over processes); the summary rows then cover those cells."""
    results = []
    for widths, depth, settings in grid(quick)[cells or slice(None)]:
        result = compare(widths, depth, **settings)
        results.append(result)
        emit("plan_cell", result["planned_gb"], result["measured_gb"], "GB peak per process", **result)
    count = len(results)
    if not count:
        return
    peaks = sum(within(r["peak_ratio"], PEAK_GOAL) for r in results)
    flops = sum(all(within(v, FLOPS_GOAL) for v in r["flops_ratios"].values()) for r in results)
    categories = sum(all(within(v, CATEGORY_GOAL) for v in r["category_ratios"].values()) for r in results)
    worst = max(results, key=lambda r: abs(r["peak_ratio"] - 1))
    emit(
        "plan_grid_peak",
        peaks,
        count,
        "cells within +-10%",
        goal="every cell",
        worst=worst["cell"],
        worst_ratio=worst["peak_ratio"],
    )
    emit("plan_grid_flops", flops, count, "cells within +-5% in every phase", goal="every cell")
    emit(
        "plan_grid_categories", categories, count, "cells with every category within +-15%", goal="every cell"
    )
    if full_depth and not quick:
        for widths in ("3b", "7b"):
            settings = {
                "visual_tokens": 2048,
                "group_size": 8,
                "answer_tokens": 128,
                "gradient_checkpointing": True,
            }
            result = compare(widths, None, **settings)
            emit(
                "plan_full_depth",
                result["planned_gb"],
                result["measured_gb"],
                "GB peak per process",
                **result,
            )
