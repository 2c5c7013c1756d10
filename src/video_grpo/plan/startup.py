"""The plan of the run being started, logged in one line before the model loads: the planner's one entry point
for the trainer (``video_grpo.grpo``)."""

from __future__ import annotations

from video_grpo.plan.model import load_model_config, read_model_shape
from video_grpo.plan.recipe import GB, Plan, make_plan
from video_grpo.plan.workload import workload_from_recipe


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
    model_values, source = load_model_config(
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
    plan = make_plan(shape, work, gpu)
    plan.source = source  # offline, a shipped model's architecture comes from configs/models/
    return plan


def log_startup_plan(script_args, training_args, model_args, logger) -> Plan | None:
    """Log the run's plan in one line before the model loads; warn when it exceeds the GPU. Never fails: an
    estimate can be wrong, and a plan that cannot be made must not stop training."""
    try:
        plan = startup_plan(script_args, training_args, model_args)
    except Exception as err:  # noqa: BLE001 (a planner error is logged, never raised)
        logger.warning(f"plan: could not plan this run's memory ({type(err).__name__}: {err})")
        return None
    if plan.source:
        logger.warning(plan.source)
    logger.warning(plan.summary())  # warning level: the default log level shows it, as it does a resume
    if plan.fits is False:
        logger.warning(
            f"plan: the estimated peak ({plan.memory.peak / GB:.1f} GB in {plan.memory.peak_phase}) exceeds "
            f"{plan.usable_bytes / GB:.1f} GB usable on this GPU; see `python -m video_grpo.plan --config ...` for "
            "changes that fit. Training goes on: the estimate may be wrong."
        )
    return plan
