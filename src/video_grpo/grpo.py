"""Train Qwen2.5-VL, Qwen3-VL or Qwen3.5 with GRPO on temporal video grounding.

    accelerate launch --config_file configs/accelerate/zero3.yaml -m video_grpo.grpo \\
        --config configs/grpo/qwen2_5_vl_7b_charades.yaml [--any_field value ...]

One YAML holds the fields of three dataclasses: ``GRPOScriptArguments`` (data, video, rewards), TRL's
``GRPOConfig`` (training) and ``ModelConfig`` (model, LoRA). Command-line flags override the YAML.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import datasets
import transformers
from transformers import AutoProcessor, set_seed
from trl import GRPOConfig, ModelConfig, TrlParser, get_peft_config

from video_grpo.configs import GRPOScriptArguments, current_flag_names, validate_recipe
from video_grpo.data.dataset import build_datasets
from video_grpo.data.sample_weights import draw_weights
from video_grpo.data.sources import recipe_sources
from video_grpo.inputs.families import family_of_model
from video_grpo.loss.guidance import check_guided_template
from video_grpo.plan.startup import check_plan, decode_cache_tokens, fit_run, log_startup_plan
from video_grpo.rewards.functions import recipe_reader, resolve_reward_funcs
from video_grpo.runtime.checkpoints import last_complete_checkpoint
from video_grpo.runtime.deepspeed_imports import before_parsing, defer_muon_compile, shm_comm_build_skipped
from video_grpo.runtime.distributed import end_run, exit_process
from video_grpo.runtime.memory_check import install_plan_check, wanted
from video_grpo.trainer import VideoGRPOTrainer

logger = logging.getLogger(__name__)


def main(script_args: GRPOScriptArguments, training_args: GRPOConfig, model_args: ModelConfig) -> None:
    # Logging and seed
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    set_seed(training_args.seed)

    # Every check that needs no model: a bad recipe fails here, in seconds
    validate_recipe(script_args, training_args, model_args)

    # auto_fit: the cheapest changes that keep the mathematics and make the plan fit the device, on every rank
    # alike (the same plan from the same arguments); an error when none does, before the model loads
    if script_args.auto_fit:
        apply_auto_fit(script_args, training_args, model_args)

    # What the step will need per GPU (video_grpo.plan), before the model loads: logged, and a warning on CUDA
    # when it exceeds the device; never an error
    if training_args.process_index == 0:
        log_startup_plan(script_args, training_args, model_args, logger)

    # Resume from the last complete checkpoint in output_dir, if any
    last_checkpoint = last_complete_checkpoint(training_args.output_dir)
    checkpoint = training_args.resume_from_checkpoint or last_checkpoint
    if checkpoint is not None and training_args.process_index == 0:
        # Warning level: at the default log level a resume must still be visible
        logger.warning(f"Checkpoint detected, resuming training at {checkpoint}.")

    # DeepSpeed's Muon kernels compiled on their first call (never, without Muon), not when its ZeRO optimizer
    # imports them: 2.5 CPU s a rank (video_grpo.runtime.deepspeed_imports)
    if training_args.deepspeed_plugin is not None:
        logger.debug(f"DeepSpeed's Muon compile deferred: {defer_muon_compile()}")
        logger.debug(f"DeepSpeed's CPU shm comm op build skipped: {shm_comm_build_skipped()}")
    trainer = build_trainer(script_args, training_args, model_args)
    on_cuda = trainer.accelerator.device.type == "cuda"
    if training_args.process_index == 0 and wanted(script_args.plan_check, on_cuda):
        install_check(script_args, training_args, model_args, trainer)
    state = trainer.accelerator.state
    zero_stage = state.deepspeed_plugin.zero_stage if state.deepspeed_plugin is not None else None
    logger.info(
        f"distributed_type={state.distributed_type.value} num_processes={state.num_processes} "
        f"zero_stage={zero_stage} device={state.device}"
    )
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    metrics = train_result.metrics
    metrics["train_samples"] = len(trainer.train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()

    # Save the final model and processor
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(training_args.output_dir)
    logger.info(f"Model saved to {training_args.output_dir}")
    end_run(trainer.accelerator)


def apply_auto_fit(
    script_args: GRPOScriptArguments, training_args: GRPOConfig, model_args: ModelConfig
) -> None:
    """Fit the run to its device (``video_grpo.plan.autofit``): set the chosen ``GRPOConfig`` fields, write
    ``output_dir/auto_fit.json`` and log it; raise, listing what else would fit, when no change that keeps the
    mathematics does."""
    result = fit_run(script_args, training_args, model_args)
    if not result.fits:
        raise ValueError(result.message())
    generation_batch = training_args.generation_batch_size
    for name, value in result.fields.items():
        setattr(training_args, name, value)
    if "gradient_checkpointing" in result.fields:  # transformers reads the new name; the old one mirrors it
        training_args.activation_checkpointing = result.fields["gradient_checkpointing"]
    # GRPOConfig derived the generation batch from the micro-batch when it was parsed; it must not move
    rows = training_args.per_device_train_batch_size * training_args.world_size
    if training_args.generation_batch_size != generation_batch or (
        rows * training_args.steps_per_generation != generation_batch
    ):
        raise RuntimeError(f"auto_fit would change the generation batch ({result.fields}); please report it")
    if training_args.process_index == 0:
        record = result.as_json()
        os.makedirs(training_args.output_dir, exist_ok=True)
        with open(os.path.join(training_args.output_dir, "auto_fit.json"), "w") as f:
            json.dump(record, f, indent=2)
        logger.warning(result.summary())
        logger.warning(f"auto_fit.json: {json.dumps(record)}")


def install_check(
    script_args: GRPOScriptArguments, training_args: GRPOConfig, model_args: ModelConfig, trainer
) -> None:
    """The plan check (``video_grpo.runtime.memory_check``) on this rank; a plan that cannot be made only skips it."""
    try:
        plan = check_plan(script_args, training_args, model_args)
    except Exception as err:  # noqa: BLE001 (a planner error is logged, never raised)
        logger.warning(f"plan check: skipped, the step could not be planned ({type(err).__name__}: {err})")
        return
    from video_grpo.plan.startup import plan_at_step, workload_sizes

    install_plan_check(trainer, plan, training_args.output_dir, replan=plan_at_step, sizes_of=workload_sizes)


def build_trainer(
    script_args: GRPOScriptArguments, training_args: GRPOConfig, model_args: ModelConfig
) -> VideoGRPOTrainer:
    """Rewards, datasets, processor and trainer (which loads the model) from the three parsed dataclasses.
    Call :func:`validate_recipe` first: it fails in seconds on what this would fail on after loading."""
    # Rewards (resolved before the model loads, so a bad name fails fast)
    reward_funcs = resolve_reward_funcs(script_args.reward_funcs, script_args.reward_kwargs)

    # Data: rows decode their video lazily, in DataLoader workers when dataloader_num_workers > 0, with the frame
    # size of the model's family (read from its config.json; an unsupported model type fails here)
    family = family_of_model(
        model_args.model_name_or_path, model_args.model_revision, training_args.trust_remote_code
    )
    train_dataset, eval_dataset = build_datasets(script_args, family)
    if script_args.gt_guidance:  # a one-span guided answer cannot write a multi-span query: refuse it now
        where = {source.name: source.describe() for source in recipe_sources(script_args)}
        check_guided_template(script_args.answer_template, train_dataset, where)
    sample_weights = None
    # TimeLens2's draw weights, from the starting model's mean IoU per query (video_grpo.data.sample_weights)
    if script_args.sample_weight_mean_power > 0:
        sample_weights = draw_weights(
            train_dataset.data.column("id").to_pylist(),
            script_args.sample_weight_file,
            script_args.sample_weight_field,
            script_args.sample_weight_mean_power,
        )

    # Model and processor. TRL loads the model from its path with these kwargs (and the reference model, if beta > 0).
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }
    processor = AutoProcessor.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    return VideoGRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
        grounding_eval_samples=script_args.eval_grounding_samples,
        span_scoring=script_args.span_scoring,
        span_reader=recipe_reader(script_args.reward_funcs, script_args.reward_kwargs),
        max_bad_sample_fraction=script_args.max_bad_sample_fraction,
        freeze_vision_tower=script_args.freeze_vision_tower,
        gt_guidance=script_args.gt_guidance,
        advantage_shaping=script_args.advantage_shaping,
        sample_weights=sample_weights,
        answer_template=script_args.answer_template,
        shared_prefix=script_args.shared_prefix,
        frame_timestamps_in_text=script_args.frame_timestamps_in_text,
        train_vision_merger=script_args.train_vision_merger,
        decode_compile=script_args.decode_compile,
        decode_compile_backend=script_args.decode_compile_backend,
        decode_cuda_graphs=script_args.decode_cuda_graphs,
        decode_cache_tokens=decode_cache_tokens(
            script_args,
            model_args.model_name_or_path,
            training_args.max_completion_length,
            model_args.model_revision,
            training_args.chat_template_kwargs,
        ),
    )


def parse_args(args: list[str] | None = None) -> tuple[GRPOScriptArguments, GRPOConfig, ModelConfig]:
    args = current_flag_names(args)
    # DeepSpeed's CPU shared-memory comm op (inference only) not built: 85 CPU s the first time in an environment.
    # Before the config is built: its __post_init__ may make the distributed state (runtime.deepspeed_imports)
    before_parsing(args)
    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig))
    return parser.parse_args_and_config(args)


if __name__ == "__main__":
    main(*parse_args())
    exit_process(0)
