"""What one GPU does in one GRPO step of a recipe, in the numbers the planner needs: tokens, rows, settings.

Read from the recipe YAML (with the defaults of ``GRPOScriptArguments``, TRL's ``GRPOConfig`` and ``ModelConfig``
for what it leaves out) and an accelerate config, without building any of them: a recipe is planned on a
machine that may have neither the data nor a GPU.

The video is planned at its worst case: the most visual tokens the recipe's budget allows
(``video_max_tokens``, ``video_max_frames`` x ``video_max_pixels``), and every answer at
``max_completion_length``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from video_grpo.inputs.families import ModelFamily
from video_grpo.plan.prompt_text import longest_text_around


def decode_cache_positions(prompt_tokens: int, temporal_patches: int, completion_tokens: int) -> int:
    """Length of the compiled decoder's static cache (``decode_compile``; ``video_grpo.rollout.decode``): the worst-case
    prompt, one more token per frame pair (the prompt is planned with each pair's time text under 100 s,
    :data:`video_grpo.plan.prompt_text.PLANNED_SECONDS`; one digit more covers videos up to 1000 s), and every
    answer token, rounded up as the decoder rounds (64). A prompt longer still makes the decoder reallocate the
    cache (one recompile, with a warning)."""
    from video_grpo.rollout.decode import cache_length

    return cache_length(prompt_tokens + temporal_patches + completion_tokens)


@dataclass(frozen=True)
class Workload:
    """One rank's share of one GRPO step."""

    visual_tokens: int  # language-model tokens of one video, worst case
    temporal_patches: int  # frame pairs of that video (its grid's t)
    frame_tokens: int  # tokens per frame pair (h x w / merge**2)
    text_tokens: int  # prompt tokens that are not video placeholders (time text included; prompt_text.py)
    completion_tokens: int  # every answer at max_completion_length
    group_size: int  # G
    micro_batch_rows: int  # per_device_train_batch_size
    generation_rows: int  # rows generated at once on this rank: micro-batch x steps_per_generation
    gradient_accumulation: int = 1
    shared_prefix: bool = True  # packed old/ref/loss forwards and one prefill per prompt
    encode_once: bool = True
    gradient_checkpointing: bool = True
    training: str = "full"  # "full", "lora" or "frozen_tower"
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    beta: float = 0.0
    old_policy_pass: bool = False
    dtype: str = "bfloat16"  # the weights' dtype
    mixed_precision: bool = True  # DeepSpeed's bf16: fp32 master weights in the optimizer
    zero_stage: int = 0  # 0 = no DeepSpeed
    num_processes: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False
    gather_for_generation: bool = True  # TRL's ds3_gather_for_generation
    decode_compile: str = "auto"  # the recipe's decode_compile (auto: compiled on CUDA); see decode_path
    decode_backend: str = "inductor"  # its decode_compile_backend
    decode_cuda_graphs: bool = False  # its decode_cuda_graphs
    # A measured step planned at its own sizes (video_grpo.runtime.memory_check): the video's own (t, h, w) patch grid
    # (None: the most square grid of frame_tokens per pair); the static cache the decoder was given, sized once
    # from the recipe's worst case (0: from this workload's prompt and answers); the widest packed loss row and
    # the answer tokens a micro-batch scores, each answer at its own length (0: every answer at completion_tokens)
    video_grid: tuple[int, int, int] | None = None
    static_cache_tokens: int = 0
    loss_length: int = 0
    scored_tokens: int = 0
    sources: dict = field(default_factory=dict, compare=False)  # where each number came from, for the report

    @property
    def prompt_tokens(self) -> int:
        return self.text_tokens + self.visual_tokens

    @property
    def prompts_per_micro_batch(self) -> int:
        return max(1, self.micro_batch_rows // self.group_size)

    @property
    def prompts_per_generation(self) -> int:
        return max(1, math.ceil(self.generation_rows / self.group_size))

    @property
    def decode_cache_tokens(self) -> int:
        """Positions of the compiled decoder's static cache (:func:`decode_cache_positions`)."""
        if self.static_cache_tokens:
            return self.static_cache_tokens
        return decode_cache_positions(self.prompt_tokens, self.temporal_patches, self.completion_tokens)

    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)


DECODE_PATHS = ("eager", "compiled", "compiled_cuda_graphs")


def decode_path(work: Workload, device: str = "cuda") -> str:
    """How this run decodes on ``device``, as the trainer decides (:func:`video_grpo.rollout.decode.decode_settings`):
    ``eager`` (a dynamic cache, a kernel launch per op), ``compiled`` (the static cache and fused kernels, allocated
    per generation call; under ZeRO-3 with ds3_gather_for_generation, whose gathered weights move) or
    ``compiled_cuda_graphs`` (``decode_cuda_graphs``: the step replayed as one graph; the static cache stays
    allocated all step)."""
    from video_grpo.rollout.decode import decode_compile_on, decode_settings

    if not decode_compile_on(work.decode_compile, device):
        return "eager"
    settings, _ = decode_settings(
        work.decode_backend, device, work.zero_stage, work.gather_for_generation, work.decode_cuda_graphs
    )
    if settings is None:  # the trainer turns decode_compile off (auto) or refuses it (true) here
        return "eager"
    return "compiled_cuda_graphs" if settings.cuda_graphs else "compiled"


def worst_case_video(
    family: ModelFamily, max_tokens: int, max_frames: int, min_pixels: int, max_pixels: int
) -> tuple[int, int, int]:
    """(visual tokens, temporal patches, tokens per frame pair) of the largest video the sampler allows.

    The sampler (:func:`video_grpo.data.video.plan_sampling`) shrinks frames to fit ``max_tokens``, then drops frames;
    so a video has at most ``max_tokens`` tokens, and at most ``max_frames / 2`` pairs of ``max_pixels``."""
    per_token = family.pixels_per_token
    pairs = max(1, max_frames // family.temporal_patch)
    per_pair_max = max(1, max_pixels // per_token)
    per_pair_min = max(1, min_pixels // per_token)
    tokens = min(max_tokens, pairs * per_pair_max)
    pairs = max(1, min(pairs, max_tokens // per_pair_min))  # each pair costs at least min_pixels
    per_pair = max(1, tokens // pairs)
    return per_pair * pairs, pairs, per_pair


def recipe_values(path: str | Path) -> dict:
    """The recipe's fields over the defaults of the three dataclasses it fills (nothing is instantiated)."""
    import yaml

    from video_grpo.configs import GRPOScriptArguments
    from video_grpo.plan.cache import dataclass_defaults, trl_defaults

    values: dict = {**trl_defaults(), **dataclass_defaults(GRPOScriptArguments)}
    with open(path) as f:
        recipe = yaml.safe_load(f) or {}
    unknown = sorted(set(recipe) - set(values))
    if unknown:
        raise ValueError(f"{path}: unknown fields {unknown}; they are not fields of the recipe's dataclasses")
    values.update(recipe)
    # as TrainingArguments resolves them: the new name wins, the deprecated alias (TRL's default True) fills in
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if values.get(new) is None:
            values[new] = values.get(old)
        values[old] = values[new]
    return values


def accelerate_values(path: str | Path | None, num_processes: int | None, zero_stage: int | None) -> dict:
    """Processes, ZeRO stage, offload and mixed precision from an accelerate config, or from the flags."""
    values = {"num_processes": 1, "zero_stage": 0, "offload_optimizer": False, "offload_params": False}
    values["mixed_precision"] = None
    if path is not None:
        import yaml

        with open(path) as f:
            config = yaml.safe_load(f) or {}
        deepspeed = config.get("deepspeed_config") or {}
        values.update(
            num_processes=int(config.get("num_processes", 1)),
            zero_stage=int(deepspeed.get("zero_stage", 0))
            if config.get("distributed_type") == "DEEPSPEED"
            else 0,
            offload_optimizer=deepspeed.get("offload_optimizer_device", "none") not in (None, "none"),
            offload_params=deepspeed.get("offload_param_device", "none") not in (None, "none"),
            mixed_precision=config.get("mixed_precision"),
        )
    if num_processes is not None:
        values["num_processes"] = num_processes
    if zero_stage is not None:
        values["zero_stage"] = zero_stage
    return values


def workload_from_recipe(
    recipe: dict, family: ModelFamily, launch: dict, stateful_text: bool = False
) -> Workload:
    """The :class:`Workload` of a recipe's values (:func:`recipe_values`) on a launch (:func:`accelerate_values`).

    ``stateful_text``: the model has sequence-state layers its family cannot fork after the prompt
    (:func:`video_grpo.inputs.prefix.unforkable_layers`), where the shared prompt falls back to the plain forward; Qwen3.5's
    Gated DeltaNet layers are forked (:mod:`video_grpo.inputs.state_fork`), so it shares."""
    from video_grpo.rollout.decode import parse_cuda_graphs

    family = family.with_text_timestamps(bool(recipe.get("frame_timestamps_in_text")))
    visual, pairs, per_pair = worst_case_video(
        family,
        recipe["video_max_tokens"],
        recipe["video_max_frames"],
        recipe["video_min_pixels"],
        recipe["video_max_pixels"],
    )
    rows = int(recipe["per_device_train_batch_size"])
    steps_per_generation = recipe.get("steps_per_generation") or recipe["gradient_accumulation_steps"]
    lora = bool(recipe.get("use_peft"))
    training = "lora" if lora else "frozen_tower" if recipe.get("freeze_vision_tower") else "full"
    dtype = recipe.get("dtype") or "float32"
    dtype = "float32" if dtype in ("auto", None) else dtype
    mixed = (launch["mixed_precision"] or ("bf16" if recipe.get("bf16") else "no")) == "bf16"
    shared = recipe.get("shared_prefix") is not False and not stateful_text
    from video_grpo.data.sources import parse_train_sources, prompt_templates
    from video_grpo.rollout.decode import parse_decode_compile

    templates = prompt_templates(
        parse_train_sources(recipe.get("train_sources")),
        recipe.get("prompt_template"),
        recipe.get("eval_file"),
    )
    around = longest_text_around(
        family, templates, pairs, recipe.get("model_name_or_path"), recipe.get("chat_template_kwargs")
    )
    return Workload(
        visual_tokens=visual,
        temporal_patches=pairs,
        frame_tokens=per_pair,
        text_tokens=around.tokens(pairs),
        completion_tokens=int(recipe["max_completion_length"]),
        group_size=int(recipe["num_generations"]),
        micro_batch_rows=rows,
        generation_rows=rows * int(steps_per_generation),
        gradient_accumulation=int(recipe["gradient_accumulation_steps"]),
        shared_prefix=shared,
        gradient_checkpointing=bool(recipe.get("gradient_checkpointing")),
        training=training,
        lora_rank=int(recipe.get("lora_r") or 0) if lora else 0,
        lora_targets=tuple(recipe.get("lora_target_modules") or ()) if lora else (),
        beta=float(recipe.get("beta") or 0.0),
        old_policy_pass=int(recipe.get("num_iterations") or 1) > 1
        or int(steps_per_generation) > int(recipe["gradient_accumulation_steps"]),
        dtype=dtype,
        mixed_precision=mixed and launch["zero_stage"] > 0,
        zero_stage=launch["zero_stage"],
        num_processes=launch["num_processes"],
        offload_optimizer=launch["offload_optimizer"],
        offload_params=launch["offload_params"],
        gather_for_generation=bool(recipe.get("ds3_gather_for_generation", True)),
        decode_compile=parse_decode_compile(recipe.get("decode_compile", "auto")),
        decode_backend=recipe.get("decode_compile_backend") or "inductor",
        decode_cuda_graphs=parse_cuda_graphs(recipe.get("decode_cuda_graphs", False)),
        sources={"text_tokens": around.source},
    )
