"""Will it fit, and how long will it take? Plan a recipe's GPU memory and step time before renting the GPUs.

    python -m video_grpo.plan --config configs/grpo/qwen2_5_vl_7b_charades.yaml \\
        --accelerate_config configs/accelerate/zero3.yaml --gpu h100-80gb
    python -m video_grpo.plan --config RECIPE.yaml --num_processes 8 --zero_stage 3 --gpu_memory_gb 48 --json

No weights are loaded. The model's ``config.json`` comes from ``--model_config``, or from the recipe's
``model_name_or_path`` when it is a local folder or in the Hugging Face cache (``configs/models/`` has the
published configs of the supported models). The video is planned at the worst case the recipe allows, every answer
at ``max_completion_length``.

Memory per GPU is given by phase (generation, old-policy/reference forwards, loss forward + backward, optimizer
step) and by category, with the peak, its phase and its largest category, and a verdict against the GPU that keeps
:data:`HEADROOM` free. When it does not fit, the cheapest changes that would are listed with their new peak.
Compute is given as FLOPs per phase and, for a named GPU, seconds per phase at stated efficiencies.
``--gpu cpu`` plans one CPU process with no headroom: what the tests and benchmarks measure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass

from video_grpo.plan_compute import COMPUTE_EFFICIENCY, DECODE_BANDWIDTH_EFFICIENCY, GPUS, plan_compute
from video_grpo.plan_memory import CATEGORIES, MemoryPlan, plan_memory
from video_grpo.plan_model import ModelShape, load_model_config, read_model_shape
from video_grpo.plan_workload import Workload, accelerate_values, recipe_values, workload_from_recipe

# A plan counts live tensors. A GPU also holds the CUDA context and kernels (~0.5-1 GB), NCCL's buffers (~0.5-1
# GB) and what PyTorch's caching allocator reserves but cannot reuse (fragmentation, commonly 5-15% of the peak);
# a recipe fits when its peak stays under this share of the card's memory.
HEADROOM = 0.15
GB = 1e9  # memory is reported in GB (10^9 bytes), as GPUs are sold


@dataclass
class Plan:
    """A plan and what it was made from."""

    shape: ModelShape
    work: Workload
    memory: MemoryPlan
    flops: dict[str, int]
    seconds: dict[str, float] | None
    gpu: dict | None  # the GPUS entry, or {"name": ..., "memory_gb": ...}

    @property
    def usable_bytes(self) -> float | None:
        if self.gpu is None:
            return None
        share = 1.0 if self.gpu.get("cpu") else 1 - HEADROOM
        return self.gpu["memory_gb"] * GB * share

    @property
    def fits(self) -> bool | None:
        usable = self.usable_bytes
        return None if usable is None else self.memory.peak <= usable

    def summary(self) -> str:
        """One line: the peak per GPU, its phase and category, and the verdict."""
        memory = self.memory
        line = (
            f"plan: peak {memory.peak / GB:.1f} GB per GPU in {memory.peak_phase} "
            f"(largest: {memory.peak_category}, {memory.phases[memory.peak_phase].by_category[memory.peak_category] / GB:.1f} GB)"
        )
        if self.gpu is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            line += f"; {verdict} {self.gpu['name']} ({self.usable_bytes / GB:.1f} GB usable)"
        return line

    def as_json(self) -> dict:
        memory = self.memory
        return {
            "peak_gb": round(memory.peak / GB, 3),
            "fits": self.fits,
            "phase": memory.peak_phase,
            "category": memory.peak_category,
            "gpu": self.gpu["name"] if self.gpu else None,
            "usable_gb": round(self.usable_bytes / GB, 3) if self.gpu else None,
            "by_phase_gb": {name: round(phase.peak / GB, 3) for name, phase in memory.phases.items()},
            "by_category_gb": {
                name: {k: round(v / GB, 3) for k, v in phase.by_category.items()}
                for name, phase in memory.phases.items()
            },
            "host_gb": round(memory.host_bytes / GB, 3),
            "flops_by_phase": self.flops,
            "time_s_by_phase": {k: round(v, 3) for k, v in self.seconds.items()} if self.seconds else None,
            "efficiencies": {"compute": COMPUTE_EFFICIENCY, "decode_bandwidth": DECODE_BANDWIDTH_EFFICIENCY},
            "workload": {
                "visual_tokens": self.work.visual_tokens,
                "prompt_tokens": self.work.prompt_tokens,
                "completion_tokens": self.work.completion_tokens,
                "G": self.work.group_size,
                "micro_batch_rows": self.work.micro_batch_rows,
                "generation_rows": self.work.generation_rows,
                "shared_prefix": self.work.shared_prefix,
                "gradient_checkpointing": self.work.gradient_checkpointing,
                "training": self.work.training,
                "beta": self.work.beta,
                "dtype": self.work.dtype,
                "zero_stage": self.work.zero_stage,
                "num_processes": self.work.num_processes,
            },
        }


def resolve_gpu(name: str | None, memory_gb: float | None) -> dict | None:
    if name == "cpu":
        return {"name": "CPU (one process)", "memory_gb": memory_gb or 0, "cpu": True}
    if name is not None:
        if name not in GPUS:
            raise ValueError(f"--gpu {name!r}: unknown; choose one of {', '.join([*GPUS, 'cpu'])}")
        gpu = dict(GPUS[name])
        if memory_gb is not None:
            gpu["memory_gb"] = memory_gb
        return gpu
    if memory_gb is not None:
        return {"name": f"a {memory_gb:g} GB GPU", "memory_gb": memory_gb}
    return None


def make_plan(shape: ModelShape, work: Workload, gpu: dict | None) -> Plan:
    device = "cpu" if gpu and gpu.get("cpu") else "cuda"
    memory = plan_memory(shape, work, device)
    compute = plan_compute(shape, work, device)
    seconds = compute.seconds_on(gpu) if gpu and "tflops" in gpu else None
    return Plan(shape, work, memory, compute.flops, seconds, gpu)


# -- when it does not fit --------------------------------------------------------------------------------------


def alternatives(work: Workload) -> list[tuple[str, str, Workload]]:
    """(kind, change, workload) to try, cheapest first: those that change nothing learned, then those that
    change the run's speed, then what is trained, then the data."""
    options: list[tuple[str, str, Workload]] = []
    if not work.gradient_checkpointing:
        options.append(
            ("checkpointing", "gradient_checkpointing: true", work.replace(gradient_checkpointing=True))
        )
    if work.micro_batch_rows > 1 and work.micro_batch_rows % 2 == 0:
        rows, accumulation = work.micro_batch_rows // 2, work.gradient_accumulation * 2
        options.append(
            (
                "micro-batch",
                f"per_device_train_batch_size: {rows}, gradient_accumulation_steps: {accumulation}",
                work.replace(
                    micro_batch_rows=rows,
                    generation_rows=max(rows, work.generation_rows // 2),
                    gradient_accumulation=accumulation,
                ),
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
                "optimizer states offloaded to CPU RAM (configs/accelerate/zero3_offload.yaml)",
                work.replace(zero_stage=3, offload_optimizer=True),
            )
        )
    if work.zero_stage == 3 and work.gather_for_generation:
        options.append(
            (
                "no-gather",
                "ds3_gather_for_generation: false (generation gathers one layer at a time: slower)",
                work.replace(gather_for_generation=False),
            )
        )
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
    options = alternatives(plan.work)
    for size in (1, 2, 3):
        fitting = []
        combos = sorted(
            itertools.combinations(range(len(options)), size), key=lambda combo: (sum(combo), combo)
        )
        for combo in combos:
            work, names = plan.work, []
            for index in combo:
                kind = options[index][0]
                option = next(((c, w) for k, c, w in alternatives(work) if k == kind), None)
                if option is None:
                    break
                names.append(option[0])
                work = option[1]
            else:
                new = make_plan(plan.shape, work, plan.gpu)
                if new.fits:
                    fitting.append((" + ".join(names), new.memory.peak))
            if len(fitting) == limit:
                break
        if fitting:
            return fitting
    return []


# -- the report --------------------------------------------------------------------------------------------------


def report(plan: Plan) -> str:
    work, memory = plan.work, plan.memory
    lines = [
        f"model: {plan.shape.family.name}, {plan.shape.params / 1e9:.2f}B parameters "
        f"(vision {plan.shape.vision_params / 1e9:.2f}B); training: {work.training}, {work.dtype}, "
        f"ZeRO-{work.zero_stage} on {work.num_processes} process(es)"
        + (", optimizer offloaded" if work.offload_optimizer else ""),
        f"per GPU and step: {work.generation_rows} rows generated ({work.group_size} per prompt), micro-batches of "
        f"{work.micro_batch_rows}; a prompt of {work.prompt_tokens} tokens ({work.visual_tokens} visual, worst case), "
        f"answers of {work.completion_tokens}; shared prompt {'on' if work.shared_prefix else 'off'}, "
        f"checkpointing {'on' if work.gradient_checkpointing else 'off'}, beta {work.beta:g}",
        "",
        "memory per GPU (GB), at each phase's peak:",
        "  " + f"{'':<22}" + "".join(f"{name[:12]:>13}" for name in memory.phases),
    ]
    for category in CATEGORIES:
        values = [memory.phases[name].by_category.get(category, 0) / GB for name in memory.phases]
        if any(values):
            lines.append("  " + f"{category:<22}" + "".join(f"{v:13.2f}" for v in values))
    lines.append("  " + f"{'total':<22}" + "".join(f"{p.peak / GB:13.2f}" for p in memory.phases.values()))
    if memory.host_bytes:
        lines.append(f"  host RAM per process for offloaded states: {memory.host_bytes / GB:.1f} GB")
    lines += ["", plan.summary()]
    if plan.fits is False:
        found = suggestions(plan)
        if found:
            lines.append("changes that fit, cheapest first:")
            lines += [f"  - {change}: peak {peak / GB:.1f} GB" for change, peak in found]
        else:
            lines.append("no single change or combination tried here fits; plan a larger GPU")
    lines += ["", "compute per optimizer step (this GPU's share):"]
    for phase, flops in plan.flops.items():
        seconds = f"  {plan.seconds[phase]:8.2f} s" if plan.seconds else ""
        lines.append(f"  {phase:<22}{flops / 1e12:12.1f} TFLOP{seconds}")
    if plan.seconds:
        lines.append(
            f"  times at {COMPUTE_EFFICIENCY:.0%} of {plan.gpu['name']}'s peak bf16 FLOP/s, decoding at "
            f"{DECODE_BANDWIDTH_EFFICIENCY:.0%} of its memory bandwidth (assumed, not measured)"
        )
    return "\n".join(lines)


def plan_recipe(
    config: str,
    accelerate_config: str | None = None,
    num_processes: int | None = None,
    zero_stage: int | None = None,
    gpu: str | None = None,
    gpu_memory_gb: float | None = None,
    model_config: str | None = None,
    overrides: dict | None = None,
) -> Plan:
    """The :class:`Plan` of a recipe file on a launch; ``overrides`` replace recipe fields (as command-line flags
    to ``video_grpo.grpo`` would)."""
    from video_grpo.prefix import unforkable_layers

    values = recipe_values(config)
    values.update(overrides or {})
    model_values = load_model_config(values["model_name_or_path"], model_config, values.get("model_revision"))
    shape = read_model_shape(model_values)
    launch = accelerate_values(accelerate_config, num_processes, zero_stage)
    work = workload_from_recipe(
        values, shape.family, launch, stateful_text=bool(unforkable_layers(model_values))
    )
    return make_plan(shape, work, resolve_gpu(gpu, gpu_memory_gb))


def launch_from_environment() -> dict:
    """The launch as ``accelerate launch`` describes it to its processes (environment variables)."""
    import os

    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    return {
        "num_processes": int(os.environ.get("WORLD_SIZE", "1")),
        "zero_stage": int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0")) if deepspeed else 0,
        "offload_optimizer": os.environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none")
        != "none",
        "offload_params": os.environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "none") != "none",
        "mixed_precision": os.environ.get("ACCELERATE_MIXED_PRECISION"),
    }


def startup_plan(script_args, training_args, model_args) -> Plan:
    """The plan of the run being started, from its parsed arguments and the launch's environment. On CUDA it is
    checked against this process's GPU."""
    import dataclasses

    import torch

    from video_grpo.prefix import unforkable_layers

    values = {}
    for arguments in (training_args, model_args, script_args):
        values.update({f.name: getattr(arguments, f.name) for f in dataclasses.fields(arguments)})
    model_values = load_model_config(
        model_args.model_name_or_path, None, model_args.model_revision, local_only=False
    )
    shape = read_model_shape(model_values)
    work = workload_from_recipe(
        values, shape.family, launch_from_environment(), stateful_text=bool(unforkable_layers(model_values))
    )
    gpu = None
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu = {"name": properties.name, "memory_gb": properties.total_memory / GB}
    return make_plan(shape, work, gpu)


def log_startup_plan(script_args, training_args, model_args, logger) -> Plan | None:
    """Log the run's plan in one line before the model loads; warn when it exceeds the GPU. Never fails: an
    estimate can be wrong, and a plan that cannot be made must not stop training."""
    try:
        plan = startup_plan(script_args, training_args, model_args)
    except Exception as err:  # noqa: BLE001 (a planner error is logged, never raised)
        logger.warning(f"plan: could not plan this run's memory ({type(err).__name__}: {err})")
        return None
    logger.warning(plan.summary())  # warning level: the default log level shows it, as it does a resume
    if plan.fits is False:
        logger.warning(
            f"plan: the estimated peak ({plan.memory.peak / GB:.1f} GB in {plan.memory.peak_phase}) exceeds "
            f"{plan.usable_bytes / GB:.1f} GB usable on this GPU; see `python -m video_grpo.plan --config ...` for "
            "changes that fit. Training goes on: the estimate may be wrong."
        )
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="the recipe YAML")
    parser.add_argument("--accelerate_config", help="the accelerate config the run launches with")
    parser.add_argument("--num_processes", type=int, help="GPUs in all (overrides the accelerate config)")
    parser.add_argument("--zero_stage", type=int, choices=[0, 1, 2, 3], help="DeepSpeed ZeRO stage (0: none)")
    parser.add_argument("--gpu", choices=[*GPUS, "cpu"], help="the GPU to plan for")
    parser.add_argument(
        "--gpu_memory_gb", type=float, help="the GPU's memory, if not a named GPU (or to override)"
    )
    parser.add_argument(
        "--model_config", help="the model's config.json (or its folder), for offline planning"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of the report")
    args = parser.parse_args(argv)
    try:
        plan = plan_recipe(
            args.config,
            args.accelerate_config,
            args.num_processes,
            args.zero_stage,
            args.gpu,
            args.gpu_memory_gb,
            args.model_config,
        )
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        out = plan.as_json()
        if plan.fits is False:
            out["suggestions"] = [{"change": c, "peak_gb": round(p / GB, 3)} for c, p in suggestions(plan)]
        print(json.dumps(out))
    else:
        print(report(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
