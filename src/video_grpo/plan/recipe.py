"""A recipe's plan: its memory per GPU by phase and category, its FLOPs and seconds per phase, and the verdict
against a GPU that keeps :data:`HEADROOM` free. :func:`plan_recipe` reads a recipe file and a launch;
:func:`make_plan` plans a workload already read."""

from __future__ import annotations

from dataclasses import dataclass

from video_grpo.plan import cache
from video_grpo.plan.compute import COMPUTE_EFFICIENCY, DECODE_BANDWIDTH_EFFICIENCY, GPUS, plan_compute
from video_grpo.plan.memory import MemoryPlan, plan_memory
from video_grpo.plan.model import ModelShape, find_config_file, load_model_config, read_model_shape
from video_grpo.plan.workload import (
    Workload,
    accelerate_values,
    decode_path,
    recipe_values,
    workload_from_recipe,
)

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
    source: str | None = None  # a one-line note when the model's config came from a shipped file unasked

    @property
    def decode_path(self) -> str:
        """How the run decodes on the planned device (:func:`video_grpo.plan.workload.decode_path`)."""
        return decode_path(self.work, "cpu" if self.gpu and self.gpu.get("cpu") else "cuda")

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
            "efficiencies": {
                "compute": COMPUTE_EFFICIENCY,
                "decode_bandwidth": DECODE_BANDWIDTH_EFFICIENCY[self.decode_path],
            },
            "decode_path": self.decode_path,
            "workload": {
                "visual_tokens": self.work.visual_tokens,
                "prompt_tokens": self.work.prompt_tokens,
                "prompt_text_from": self.work.sources.get("text_tokens"),
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


def stateful_text(shape: ModelShape) -> bool:
    """Whether the model has sequence-state layers its family cannot fork (:func:`video_grpo.inputs.prefix.unforkable_layers`),
    kept per model (:mod:`video_grpo.plan.cache`): importing ``video_grpo.inputs.prefix`` imports the model code."""

    def unforkable() -> bool:
        from video_grpo.inputs.prefix import unforkable_layers

        return bool(unforkable_layers(shape.config))

    return cache.cached(cache.shape_key(shape), "stateful_text", unforkable)


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
    values = recipe_values(config)
    values.update(overrides or {})
    model, revision = values["model_name_or_path"], values.get("model_revision")
    found = find_config_file(model, model_config, revision)
    if found is not None and cache.has(found.key(), "shape"):  # measured before: the config is read if asked
        shape, source = read_model_shape(found), found.note
    else:  # read now, with load_model_config's errors
        model_values, source = load_model_config(model, model_config, revision)
        shape = read_model_shape(model_values, found.key() if found is not None else None)
    launch = accelerate_values(accelerate_config, num_processes, zero_stage)
    work = workload_from_recipe(values, shape.family, launch, stateful_text=stateful_text(shape))
    plan = make_plan(shape, work, resolve_gpu(gpu, gpu_memory_gb))
    plan.source = source
    return plan
