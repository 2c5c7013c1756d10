"""The plan of the run being started, logged in one line before the model loads: the planner's one entry point
for the trainer (``video_grpo.grpo``). It also fits the run to its device (``auto_fit``,
:mod:`video_grpo.plan.autofit`) and plans the step a run checks itself against (``plan_check``,
:mod:`video_grpo.runtime.memory_check`)."""

from __future__ import annotations

import functools
import logging

from video_grpo.data.sources import prompt_templates
from video_grpo.plan.autofit import FitResult, auto_fit
from video_grpo.plan.loss_split import LossSettings
from video_grpo.plan.model import load_model_config, read_model_shape
from video_grpo.plan.prompt_text import longest_text_around
from video_grpo.plan.ranks import check_agreement, gather_devices
from video_grpo.plan.recipe import GB, Plan, make_plan, resolve_gpu
from video_grpo.plan.sizes import step_sizes
from video_grpo.plan.workload import decode_cache_positions, workload_from_recipe, worst_case_video
from video_grpo.runtime.launch_env import launch_from_environment

logger = logging.getLogger(__name__)


def run_device(training_args, memory_gb: float | None = None) -> dict | None:
    """The device a run is planned for: one CPU process (no headroom; CPU kernels) when it runs on the CPU, else a
    GPU of ``memory_gb`` when given (a user planning for another card), else this process's CUDA device, else
    None (no verdict)."""
    import torch

    if training_args.use_cpu or not torch.cuda.is_available():
        return resolve_gpu("cpu", memory_gb) if memory_gb is not None else None
    if memory_gb is not None:
        return resolve_gpu(None, memory_gb)
    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": properties.name, "memory_gb": properties.total_memory / GB}


@functools.lru_cache(maxsize=4)
def model_of_run(name: str, revision: str | None) -> tuple:
    """(config values, :class:`ModelShape`, the note when a shipped config stood in) of the run's model, read once
    per process: the planner caches its layer traces per shape object, so the start-up summary, auto-fit's
    candidates and the plan check share them."""
    model_values, source = load_model_config(name, None, revision, local_only=False)
    return model_values, read_model_shape(model_values), source


def startup_plan(script_args, training_args, model_args, gpu: dict | None = None) -> Plan:
    """The plan of the run being started, from its parsed arguments and the launch's environment. On CUDA it is
    checked against this process's GPU, or against ``gpu`` when given (:func:`run_device`)."""
    import dataclasses

    import torch

    from video_grpo.inputs.prefix import unforkable_layers

    values = {}
    for arguments in (training_args, model_args, script_args):
        values.update({f.name: getattr(arguments, f.name) for f in dataclasses.fields(arguments)})
    model_values, shape, source = model_of_run(model_args.model_name_or_path, model_args.model_revision)
    work = workload_from_recipe(
        values, shape.family, launch_from_environment(), stateful_text=bool(unforkable_layers(model_values))
    )
    if gpu is None and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu = {"name": properties.name, "memory_gb": properties.total_memory / GB}
    plan = make_plan(shape, work, gpu)
    plan.source = source  # offline, a shipped model's architecture comes from configs/models/
    return plan


def fit_run(script_args, training_args, model_args) -> FitResult:
    """Auto-fit (:func:`video_grpo.plan.autofit.auto_fit`) of the run being started, one fit for every rank: each
    rank's device (``auto_fit_memory_gb``, else its GPU) is gathered and all fit for the smallest
    (:mod:`video_grpo.plan.ranks`). A collective: every rank of a launch calls it. A CPU run needs
    ``auto_fit_memory_gb``."""
    try:  # a rank that cannot read its device still gathers (None), or the others would wait for it
        local, read_error = run_device(training_args, script_args.auto_fit_memory_gb), None
    except Exception as err:  # noqa: BLE001 (raised below, after the ranks compared their choices)
        local, read_error = None, err
    devices = gather_devices(local)
    try:
        if read_error is not None:
            raise read_error
        result = fit_for_device(script_args, training_args, model_args, devices.gpu)
        choice = (result.fits, result.fields)
    except Exception as err:  # noqa: BLE001 (raised below, after the ranks compared their choices)
        result, choice = err, f"{type(err).__name__}: {err}"
    check_agreement(choice, "auto_fit")  # every rank compares, so none is left waiting in a collective
    if isinstance(result, Exception):
        raise result
    result.ranks = devices
    return result


def fit_for_device(script_args, training_args, model_args, gpu: dict | None) -> FitResult:
    """Auto-fit of the run being started for ``gpu`` (:func:`run_device`), on this process alone."""
    if gpu is None:
        raise ValueError(
            "auto_fit_memory_gb: not set, and this run has no CUDA device to read its memory from; give the "
            "memory to fit in GB (e.g. --auto_fit_memory_gb 0.12 for a tiny CPU run), or set auto_fit: false."
        )
    plan = startup_plan(script_args, training_args, model_args, gpu)
    unavailable = {}
    if training_args.deepspeed:  # TrainingArguments filled that JSON's batch sizes when it was parsed
        unavailable["micro-batch"] = (
            "a smaller micro-batch: the DeepSpeed JSON given with --deepspeed already holds the batch sizes "
            "(launch with an accelerate config instead, or change them in both)"
        )
    return auto_fit(plan, LossSettings.of(training_args), unavailable)


def check_plan(script_args, training_args, model_args) -> Plan:
    """The plan a run's measured step is compared with (``plan_check``): the CPU kernels' plan on the CPU, this
    process's GPU's on CUDA."""
    gpu = run_device(training_args, None)
    if gpu is None:  # the CPU: planned as one CPU process, whatever the memory
        gpu = resolve_gpu("cpu", None)
    return startup_plan(script_args, training_args, model_args, gpu)


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
            "changes that fit, or set auto_fit: true to apply the cheapest changes that keep the mathematics "
            "(docs/planning.md). Training goes on: the estimate may be wrong."
        )
    return plan


def decode_cache_tokens(
    script_args,
    model_name_or_path: str,
    completion_tokens: int,
    revision: str | None = None,
    chat_template_kwargs: dict | None = None,
) -> int | None:
    """Positions of the compiled decoder's static cache (``video_grpo.rollout.decode``) for a recipe's script arguments:
    the longest prompt its video budget allows, as the planner counts it, with room for ``completion_tokens``
    (:func:`video_grpo.plan.workload.decode_cache_positions`). Reads the model's config.json, and its tokenizer when
    it is a local folder (:mod:`video_grpo.plan.prompt_text`), once per process, shared with the start-up plan.
    ``chat_template_kwargs``: the run's (GRPOConfig), which change the template's text. None, with a warning, when it
    cannot: the decoder then sizes its cache at its first call, and a planner error never stops a run."""
    from video_grpo.inputs.families import detect_family

    try:
        config, _, _ = model_of_run(model_name_or_path, revision)
        family = detect_family(config).with_text_timestamps(script_args.frame_timestamps_in_text)
        visual, pairs, _ = worst_case_video(
            family,
            script_args.video_max_tokens,
            script_args.video_max_frames,
            script_args.video_min_pixels,
            script_args.video_max_pixels,
        )
        templates = prompt_templates(
            script_args.train_sources, script_args.prompt_template, script_args.eval_file
        )
        around = longest_text_around(family, templates, pairs, model_name_or_path, chat_template_kwargs)
    except Exception as err:  # noqa: BLE001 (any planner error: sized at the first call instead)
        logger.warning(f"decode_compile: could not size the static cache from the recipe ({err})")
        return None
    return decode_cache_positions(visual + around.tokens(pairs), pairs, completion_tokens)


def workload_sizes(plan) -> dict:
    """The sizes a plan was made at, as :meth:`video_grpo.runtime.memory_check.PlanCheck.seen_sizes` records a step's."""
    work, sizes = plan.work, step_sizes(plan.shape, plan.work)
    return {
        "prompt_tokens": work.prompt_tokens,
        "completion_tokens": work.completion_tokens,
        "video_grid": list(sizes.grid),
        "micro_batch_rows": work.micro_batch_rows,
        "generation_rows": work.generation_rows,
        "loss_length": sizes.loss_length,  # of a loss forward's rows, packed by prompt or not
        "scored_tokens": sizes.scored,
    }


def plan_at_step(plan, seen: dict):
    """``plan`` made again at the sizes a measured step saw (:attr:`video_grpo.runtime.memory_check.PlanCheck.seen`): its largest video's grid,
    its longest prompt (the text is what the longest prompt holds besides that video's placeholders), its longest
    answer, its rows and, when the forwards are packed by prompt, its widest packed row and the answer tokens a
    micro-batch scored; a size not seen keeps the plan's. The compiled decoder's static cache keeps the plan's
    length: the trainer sized it once, from the recipe's worst case. No collective call, no weights: the planner
    traces one layer of each kind on fake tensors, at the new sizes."""
    work = plan.work
    changes: dict = {"static_cache_tokens": work.decode_cache_tokens}
    visual = work.visual_tokens
    if seen["grid"] is not None:
        pairs, height, width = seen["grid"]
        per_pair = height * width // plan.shape.merge**2
        visual = pairs * per_pair
        changes.update(
            visual_tokens=visual,
            temporal_patches=pairs,
            frame_tokens=per_pair,
            video_grid=tuple(seen["grid"]),
        )
    changes["text_tokens"] = max(0, seen["prompt"] - visual)
    changes["completion_tokens"] = seen["answer"]
    for rows in ("micro_batch_rows", "generation_rows"):
        if seen[rows]:
            changes[rows] = seen[rows]
    if work.shared_prefix and seen["loss_length"]:  # packed: each answer at its own length
        changes.update(loss_length=seen["loss_length"], scored_tokens=seen["scored"])
    step_plan = make_plan(plan.shape, work.replace(**changes), plan.gpu)
    step_plan.source = plan.source
    return step_plan
