"""When a plan does not fit: the changes to try, cheapest first, and those (alone or combined) that make it fit."""

from __future__ import annotations

import itertools

from video_grpo.plan.recipe import Plan, make_plan
from video_grpo.plan.workload import Workload, decode_path


def alternatives(work: Workload) -> list[tuple[str, str, Workload]]:
    """(kind, change, workload) to try, cheapest first: those that change nothing learned, then those that
    change the run's speed, then what is trained, then the data. The kinds :mod:`video_grpo.plan.autofit` may
    apply by itself are in its ``MATH_PRESERVING``."""
    options: list[tuple[str, str, Workload]] = []
    if not work.gradient_checkpointing:
        options.append(
            ("checkpointing", "activation_checkpointing: true", work.replace(gradient_checkpointing=True))
        )
    if work.micro_batch_rows > 1 and work.micro_batch_rows % 2 == 0:
        # the same generation batch and optimizer batch, in micro-batches half the size: steps_per_generation
        # doubles with the accumulation (TRL derives the generation batch from the micro-batch otherwise)
        rows, accumulation = work.micro_batch_rows // 2, work.gradient_accumulation * 2
        steps_per_generation = 2 * work.generation_rows // work.micro_batch_rows
        options.append(
            (
                "micro-batch",
                f"per_device_train_batch_size: {rows}, gradient_accumulation_steps: {accumulation}, "
                f"steps_per_generation: {steps_per_generation}",
                work.replace(micro_batch_rows=rows, gradient_accumulation=accumulation),
            )
        )
    if work.zero_stage < 3:
        options.append(
            ("zero3", "DeepSpeed ZeRO-3 (configs/accelerate/zero3.yaml)", work.replace(zero_stage=3))
        )
    options.append(
        ("gpus", f"{work.num_processes * 2} GPUs", work.replace(num_processes=work.num_processes * 2))
    )
    if not work.offload_optimizer:
        options.append(
            (
                "offload",
                "optimizer states and parameters offloaded to CPU RAM (configs/accelerate/zero3_offload.yaml)",
                work.replace(zero_stage=3, offload_optimizer=True, offload_params=True),
            )
        )
    if work.zero_stage == 3 and work.gather_for_generation:
        no_gather = work.replace(gather_for_generation=False)
        slower = "generation gathers one layer at a time: slower"
        if decode_path(work) != "eager":  # decode_compile auto (true is refused: plan.autofit.excluded_kinds)
            slower += (
                ", and decodes eagerly: decode_compile auto turns compiled decoding off without gathering"
            )
        options.append(("no-gather", f"ds3_gather_for_generation: false ({slower})", no_gather))
    if work.training == "full":
        options.append(("frozen", "freeze_vision_tower: true", work.replace(training="frozen_tower")))
    if work.training != "lora":
        lora = work.replace(
            training="lora", lora_rank=64, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj")
        )
        options.append(("lora", "use_peft: true (LoRA r=64 on q_proj, k_proj, v_proj, o_proj)", lora))
    if work.visual_tokens >= 512:
        half = work.visual_tokens // 2
        fewer = work.replace(visual_tokens=half, frame_tokens=max(1, half // max(1, work.temporal_patches)))
        options.append(("tokens", f"video_max_tokens: {half}", fewer))
    return options


def suggestions(plan: Plan, limit: int = 5) -> list[tuple[str, float]]:
    """(change, new peak in bytes) for the changes that make the recipe fit, cheapest first. When no single change
    fits, pairs and then triples of them are tried, the cheapest combinations first."""
    return [(change, peak) for _, change, peak in fitting_combinations(plan, limit)]


def fitting_combinations(plan: Plan, limit: int = 5) -> list[tuple[tuple[str, ...], str, float]]:
    """:func:`suggestions` with the kinds (as :func:`alternatives` names them) each combination is made of."""
    options = alternatives(plan.work)
    for size in (1, 2, 3):
        fitting = []
        combos = sorted(
            itertools.combinations(range(len(options)), size), key=lambda combo: (sum(combo), combo)
        )
        for combo in combos:
            work, names, kinds = plan.work, [], []
            for index in combo:
                kind = options[index][0]
                option = next(((c, w) for k, c, w in alternatives(work) if k == kind), None)
                if option is None:
                    break
                names.append(option[0])
                kinds.append(kind)
                work = option[1]
            else:
                new = make_plan(plan.shape, work, plan.gpu)
                if new.fits:
                    fitting.append((tuple(kinds), " + ".join(names), new.memory.peak))
            if len(fitting) == limit:
                break
        if fitting:
            return fitting
    return []
