"""Script arguments for video GRPO, parsed by ``TrlParser`` together with TRL's ``GRPOConfig`` and
``ModelConfig`` from one YAML file plus command-line overrides.

Every inconsistency that can be caught without the model is caught in ``__post_init__``, and what depends on
the model family (the token cost of a frame) in :func:`validate_recipe`, which reads only the model's config:
a bad recipe fails in a second, not after the model has loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields

from video_grpo.data.prompts import DEFAULT_PROMPT  # noqa: F401  (re-exported: video_grpo.configs.DEFAULT_PROMPT)
from video_grpo.rewards.answers import ANSWER_DECIMALS  # noqa: F401  (re-exported)
from video_grpo.rewards.functions import DEFAULT_ANSWER_TEMPLATE

# TimeLens's answer-only prompts (TencentARC/TimeLens training/data/grounding.py GROUNDING_PROMPT and
# GROUNDING_PROMPT_TEXT_TIMESTAMP, the same text as evaluation/utils.py), with their '{}' as our '{sentence}'.
# The answer is one sentence, read by rewards.parse_answer_only; pair them with reward_funcs [iou_answer_only].
TIMELENS_PROMPT = (
    "Please find the visual event described by the sentence '{sentence}', determining its starting and ending "
    "times. The format should be: 'The event happens in <start time> - <end time> seconds'."
)
# The TimeLens-7B (Qwen2.5-VL) prompt: frames carry their time as text before them (frame_timestamps_in_text).
TIMELENS_PROMPT_TEXT_TIMESTAMPS = (
    "You are given a video with multiple frames. The numbers before each video frame indicate its sampling "
    "timestamp (in seconds). " + TIMELENS_PROMPT
)


@dataclass
class GRPOScriptArguments:
    """Data, video sampling and reward settings. Model and training settings live in TRL's dataclasses."""

    train_file: str | None = field(
        default=None,
        metadata={
            "help": "Training annotations, JSONL with id, video, duration, solution [start, end], sentence."
        },
    )
    train_sources: dict | str | None = field(
        default=None,
        metadata={
            "help": "Several training annotation sources in one run, instead of train_file: a mapping of source "
            "name to {train_file, dataset_format, video_root, durations_file, prompt_template, normalize_query} "
            "(a key left out takes the recipe's field of that name; null means none). Rows come in source order, "
            "ids '<source>/<id>', each prompt from its source's template (video_grpo.data.sources). A JSON string on "
            "the command line."
        },
    )
    eval_file: str | None = field(
        default=None, metadata={"help": "Optional evaluation annotations in the same format as train_file."}
    )
    video_root: str | None = field(
        default=None,
        metadata={
            "help": "Directory that relative `video` paths are resolved against. Default: the "
            "directory of the annotation file."
        },
    )
    dataset_format: str | None = field(
        default=None,
        metadata={
            "help": "Annotation format: jsonl, charades_txt, grounding_json (TimeZero/VideoChat Charades, "
            "ActivityNet Captions), qvhighlights, timelens_100k, timelens_bench or timelens2_93k. Detected from the "
            "file when unset."
        },
    )
    durations_file: str | None = field(
        default=None,
        metadata={
            "help": "CSV with 'id' and 'length' columns giving each video's duration: the Charades CSV for "
            "charades_txt (required there); for timelens2_93k, optional (id = video_id), else each video's length "
            "is read from the video when the annotations load."
        },
    )
    video_extensions: list[str] = field(
        default_factory=lambda: [".mp4", ".webm", ".mkv", ".avi", ".mov"],
        metadata={"help": "Tried in order when an annotation names a video by id without an extension."},
    )
    strict_data: bool = field(
        default=False,
        metadata={
            "help": "Fail on spans with start >= end, ends past the video and missing videos, instead of "
            "skipping, clamping and listing them."
        },
    )
    allow_absolute_video_paths: bool = field(
        default=False,
        metadata={
            "help": "Let annotation files name videos by absolute path or with '..' outside video_root. "
            "Off by default, so an annotation file cannot point the loader at arbitrary files."
        },
    )
    max_bad_sample_fraction: float = field(
        default=0.05,
        metadata={
            "help": "A video that cannot be read during training is replaced by another sample and counted "
            "(data/bad_samples). Above this fraction of the samples seen, the run stops."
        },
    )
    train_vision_merger: bool = field(
        default=False,
        metadata={
            "help": "With freeze_vision_tower: the vision module's merger (the projection into the language "
            "model, model.visual.merger) still trains, as TimeLens's --freeze_merger False."
        },
    )
    frame_timestamps_in_text: bool = field(
        default=False,
        metadata={
            "help": "Qwen2.5-VL only: write each temporal patch's time before it in the prompt, "
            "'<t seconds>' + its own vision block, as TimeLens-7B does (video_grpo.inputs.families). Qwen3-VL and "
            "Qwen3.5 always do this; there it is an error."
        },
    )
    freeze_vision_tower: bool = field(
        default=False,
        metadata={"help": "Train the language model only; the vision encoder keeps its weights."},
    )
    shared_prefix: bool | None = field(
        default=None,
        metadata={
            "help": "Run each prompt through the language model once per micro-batch in the old-policy, "
            "reference and loss forwards, its G answers attending to that one copy (exact; see docs/training.md "
            "'Sharing the prompt across a group'). Unset (the default): on where it is exact (Qwen2.5-VL, Qwen3-VL with sdpa or "
            "eager attention), off with one warning elsewhere. true: on, or an error before the model loads. "
            "false: off."
        },
    )
    decode_compile: str = field(
        default="auto",
        metadata={
            "help": "Decode every generation from one static cache with a compiled step (video_grpo.rollout.decode; "
            "docs/training.md 'Compiled decoding'): auto (the default) on CUDA, off elsewhere; true also on CPU; "
            "false: eager decoding. The same tokens in fp32; logged as decode/compiled and decode/recompiles."
        },
    )
    decode_compile_backend: str = field(
        default="inductor",
        metadata={
            "help": "torch.compile backend of the decode step: inductor (fused kernels, CUDA graphs where safe), "
            "or aot_eager / eager (the same graph without code generation: seconds to build, for tests)."
        },
    )
    decode_cuda_graphs: bool = field(
        default=False,
        metadata={
            "help": "With decode_compile: replay the compiled step as one CUDA graph (inductor on CUDA; not under "
            "ZeRO-3, whose gathered weights move). The static cache then stays allocated all step, which the "
            "planner counts: rows x (longest prompt + answer) x KV bytes per token."
        },
    )
    frame_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Directory of pre-decoded frames written by `python -m video_grpo.preprocess`. Used when "
            "an entry matches the file and every sampling setting; otherwise the video is decoded."
        },
    )
    frame_cache_format: str = field(
        default="jpeg",
        metadata={
            "help": "How preprocess stores frames and which entries training reads: 'jpeg' (about 1/12 the "
            "size of raw, ~40 dB PSNR against the decoded frames; reads raw entries too) or 'raw' (exact "
            "uint8 frames, about 45x the mp4). See video_grpo.data.frame_cache."
        },
    )
    eval_grounding_samples: int | None = field(
        default=64,
        metadata={
            "help": "With eval_strategy set: how many eval queries are answered greedily at each evaluation "
            "for R1@0.3/0.5/0.7 and mIoU (logged as eval_R1@0.5, eval_mIoU). None: all; 0: skip."
        },
    )
    span_scoring: str = field(
        default="best_window",
        metadata={
            "help": "How an answer's IoU is computed for R1@m and mIoU, in training's evaluation and in `evaluate "
            "run --config` (its --span_scoring wins): best_window (the last span of the answer, best IoU over the "
            "true windows), set (TimeLens2's multi-span IoU) or timelens (TimeLens's and TimeLens2's VLMEvalKit "
            "scoring: the first pair of TimeLens's extract_time, plain IoU, unswapped). See video_grpo.rewards.span_scoring."
        },
    )
    eval_generation_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "How `evaluate run --config` decodes, as transformers GenerationConfig keys: do_sample, "
            "temperature, top_p, top_k, max_new_tokens, repetition_penalty (a command-line flag wins over its "
            "key). Unset keys keep evaluate's defaults: greedy, 256 new tokens. temperature, top_p and top_k "
            "need do_sample: true. A JSON string on the command line."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training records (for smoke runs)."}
    )
    auto_fit: bool = field(
        default=False,
        metadata={
            "help": "Before the model loads, apply the cheapest changes that keep the mathematics of every step "
            "and make the planned peak fit the device (a smaller micro-batch with the same generation and optimizer "
            "batches, gradient checkpointing, layer-by-layer gathering for generation under ZeRO-3), chosen by the "
            "planner's ranking; stop when none fits. Writes output_dir/auto_fit.json. See docs/planning.md."
        },
    )
    auto_fit_memory_gb: float | None = field(
        default=None,
        metadata={
            "help": "The device memory auto_fit fits the run in, in GB (a GPU keeps video_grpo.plan.HEADROOM "
            "free; a CPU run none). Default: this process's CUDA device; a CPU run must give it."
        },
    )
    plan_check: bool | None = field(
        default=None,
        metadata={
            "help": "After the first optimizer step, measure each phase's peak over the next step beside the "
            "plan and write output_dir/plan_check.json (video_grpo.runtime.memory_check). None: on with CUDA "
            "(torch.cuda.max_memory_allocated, free), off on the CPU (live tensor bytes, which slow the step)."
        },
    )
    video_fps: float = field(
        default=2.0, metadata={"help": "Frames sampled per second of video, before the frame and token caps."}
    )
    video_min_frames: int = field(default=4, metadata={"help": "Fewest frames sampled from any video."})
    video_max_frames: int = field(default=64, metadata={"help": "Most frames sampled from any video."})
    video_min_pixels: int = field(
        default=16 * 28 * 28,
        metadata={
            "help": "Smallest area (H*W) a sampled frame is resized to. Must be <= video_max_pixels and at "
            "least one visual token (28x28 for Qwen2.5-VL, 32x32 for Qwen3-VL and Qwen3.5)."
        },
    )
    video_max_pixels: int = field(
        default=256 * 28 * 28,
        metadata={"help": "Largest area (H*W) a sampled frame is resized to."},
    )
    video_max_tokens: int = field(
        default=3584,
        metadata={
            "help": "Hard cap on visual tokens per video (frames/2 * H*W / pixels per token). Frames are first shrunk "
            "towards video_min_pixels, then fewer frames are taken, spread over the whole video."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["iou", "format"],
        metadata={
            "help": "Reward names from video_grpo.rewards.functions.REWARD_FUNCS, or dotted paths "
            "'package.module:function'. Weights come from GRPOConfig.reward_weights."
        },
    )
    reward_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Parameters bound to rewards, keyed by their name in reward_funcs, e.g. "
            "{length_penalty: {max_think_words: 128}}. A JSON string on the command line."
        },
    )
    prompt_template: str = field(
        default=DEFAULT_PROMPT,
        metadata={
            "help": "User prompt after the video. '{sentence}' is replaced by the query; '{duration}' "
            "(optional) by the video length in seconds."
        },
    )
    normalize_query: bool = field(
        default=False,
        metadata={
            "help": "Fold whitespace runs in each query and drop its trailing periods before it goes into the "
            "prompt, as TimeLens2 does (grpo/timelens/data/prompt.py); the timelens_100k and timelens_bench loaders "
            "always do. The default of train_sources' normalize_query."
        },
    )
    gt_guidance: bool = field(
        default=False,
        metadata={
            "help": "Ground-truth-guided rollouts (TempSamp-R1, arXiv 2509.18056): each group holds G-1 sampled "
            "answers and one off-policy answer written from the annotated span. Pair it with "
            "advantage_shaping: tempsamp; without shaping the guided answer's reward lifts the group mean "
            "and can push every sampled answer's advantage below zero."
        },
    )
    advantage_shaping: str = field(
        default="none",
        metadata={
            "help": "How rewards become advantages: 'none' (TRL's group normalisation) or 'tempsamp' "
            "(TempSamp-R1's non-linear reward shaping, Eq. 4, before the same normalisation; see "
            "video_grpo.loss.grpo_math.shaped_advantages)."
        },
    )
    answer_template: str = field(
        default=DEFAULT_ANSWER_TEMPLATE,
        metadata={
            "help": "An answer written from the annotated span: the cold-start SFT target (video_grpo.sft) and, "
            "with gt_guidance, the guided answer. {start} and {end} are seconds, written with "
            "video_grpo.rewards.answers.ANSWER_DECIMALS (1) places in both, so the guided answer has the precision "
            "the cold start teaches the policy; {spans} is every annotated span as [[S, E], ...] (TimeLens2's "
            "JSON form; needed for multi-span solutions); {sentence} is the query."
        },
    )

    sample_weight_mean_power: float = field(
        default=0.0,
        metadata={
            "help": "TimeLens2's draw weights (video_grpo.data.sample_weights). 0 (default): TRL's shuffled pass over "
            "the queries. > 0: each epoch orders the queries by weight, without replacement (TimeLens2's draw): the "
            "next prompt is drawn from those left with probability proportional to (1 - mean reward + 1e-8)^power, "
            "the mean reward being the starting model's, per query, from sample_weight_file, so hard queries come "
            "early and every query still comes once an epoch. TimeLens2's released recipe: 2."
        },
    )
    sample_weight_file: str | None = field(
        default=None,
        metadata={
            "help": "Per-query JSONL with each training query's id and mean reward (sample_weight_field), "
            "measured with the starting model: curate's per_query.jsonl (python -m video_grpo.curate). Needed "
            "when sample_weight_mean_power > 0. A query with fewer than 2 answers there (k < 2), or none, counts as "
            "mean 0, the largest weight (one warning gives the count); a file holding none of the ids is an error."
        },
    )
    sample_weight_field: str = field(
        default="mean_iou",
        metadata={
            "help": "The field of sample_weight_file holding each query's mean reward in [0, 1]: curate's "
            "mean_iou (mean tIoU over its k sampled answers; TimeLens2 uses the tIoU reward, 'tiou')."
        },
    )

    # Resolve reward_funcs (importing plug-ins) at parse time, so training fails on a bad reward before the model
    # loads. A class attribute, not a field: off only in DataToolArguments.
    import_reward_plugins = True

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> None:
            raise ValueError(f"GRPOScriptArguments.{name}: {why}")

        from video_grpo.data.annotations import FORMATS

        if self.dataset_format is not None and self.dataset_format not in FORMATS:
            fail(
                "dataset_format",
                f"unknown format {self.dataset_format!r}; choose one of {list(FORMATS)} or leave it unset.",
            )
        if self.video_fps <= 0:
            fail("video_fps", f"must be > 0, got {self.video_fps}.")
        if self.video_min_frames < 1:
            fail("video_min_frames", f"must be >= 1, got {self.video_min_frames}.")
        if self.video_min_frames > self.video_max_frames:
            fail(
                "video_min_frames",
                f"{self.video_min_frames} is above video_max_frames="
                f"{self.video_max_frames}; lower it or raise video_max_frames.",
            )
        if self.video_min_pixels > self.video_max_pixels:
            fail(
                "video_min_pixels",
                f"{self.video_min_pixels} is above video_max_pixels={self.video_max_pixels}; "
                "lower video_min_pixels or raise video_max_pixels.",
            )
        if self.auto_fit_memory_gb is not None and self.auto_fit_memory_gb <= 0:
            fail("auto_fit_memory_gb", f"must be > 0 (GB), got {self.auto_fit_memory_gb}.")
        if not 0 <= self.max_bad_sample_fraction <= 1:
            fail("max_bad_sample_fraction", f"must be in [0, 1], got {self.max_bad_sample_fraction}.")
        from video_grpo.rollout.decode import BACKENDS, parse_cuda_graphs, parse_decode_compile

        try:
            self.decode_compile = parse_decode_compile(self.decode_compile)
        except ValueError as err:
            fail("decode_compile", str(err).split(": ", 1)[1])
        try:  # a YAML string reaches the bool field unparsed: "auto" or "no" must not read as true
            self.decode_cuda_graphs = parse_cuda_graphs(self.decode_cuda_graphs)
        except ValueError as err:
            fail("decode_cuda_graphs", str(err).split(": ", 1)[1])
        if self.decode_compile_backend not in BACKENDS:
            fail(
                "decode_compile_backend",
                f"unknown backend {self.decode_compile_backend!r}; choose one of {list(BACKENDS)}.",
            )
        from video_grpo.data.frame_cache import CACHE_FORMATS

        if self.frame_cache_format not in CACHE_FORMATS:
            fail(
                "frame_cache_format",
                f"unknown format {self.frame_cache_format!r}; choose one of "
                f"{list(CACHE_FORMATS)} (jpeg: about 1/12 the size; raw: exact frames).",
            )
        if "{sentence}" not in self.prompt_template:
            fail("prompt_template", "must contain '{sentence}' where the query goes.")
        from video_grpo.data.sources import parse_train_sources

        try:
            self.train_sources = parse_train_sources(self.train_sources)
        except ValueError as err:
            raise ValueError(f"GRPOScriptArguments.{err}") from None
        if self.train_sources and self.train_file:
            fail(
                "train_file",
                f"is set ({self.train_file!r}) together with train_sources; give the file as one of the "
                "sources (train_sources.<name>.train_file) or drop train_sources.",
            )
        if isinstance(self.reward_funcs, str):
            self.reward_funcs = [name.strip() for name in self.reward_funcs.split(",") if name.strip()]
        if not self.reward_funcs:
            fail("reward_funcs", "is empty; name at least one reward, e.g. [iou, format].")
        if isinstance(self.reward_kwargs, str):
            try:
                self.reward_kwargs = json.loads(self.reward_kwargs)
            except json.JSONDecodeError as err:
                fail("reward_kwargs", f"is not valid JSON ({err.msg}): {self.reward_kwargs!r}")
        if self.reward_kwargs is not None and not (
            isinstance(self.reward_kwargs, dict)
            and all(isinstance(v, dict) for v in self.reward_kwargs.values())
        ):
            fail(
                "reward_kwargs",
                "must map reward names to parameter mappings, e.g. {length_penalty: {max_think_words: 128}}.",
            )
        if self.import_reward_plugins:
            from video_grpo.rewards.functions import recipe_reader, resolve_reward_funcs

            try:
                resolve_reward_funcs(self.reward_funcs, self.reward_kwargs)
                recipe_reader(self.reward_funcs, self.reward_kwargs)  # one reader for evaluation and curation
            except ValueError as err:
                fail("reward_funcs", str(err))
        if "iou_answer_only" in self.reward_funcs and {"format", "format_soft"} & set(self.reward_funcs):
            fail(
                "reward_funcs",
                f"{self.reward_funcs} pairs iou_answer_only (an answer-only sentence, no tags) with a format "
                "reward that needs <think>/<answer> tags; TimeLens uses [iou_answer_only] alone.",
            )
        from video_grpo.rewards.span_scoring import SPAN_SCORINGS

        if self.span_scoring not in SPAN_SCORINGS:
            fail(
                "span_scoring",
                f"unknown scoring {self.span_scoring!r}; choose one of {list(SPAN_SCORINGS)} (timelens: "
                "TimeLens's and TimeLens2's published evaluation; see video_grpo.rewards.span_scoring).",
            )
        try:
            self.eval_generation_kwargs = check_generation_kwargs(self.eval_generation_kwargs)
        except ValueError as err:
            fail("eval_generation_kwargs", str(err))
        from video_grpo.loss.grpo_math import SHAPING_METHODS

        if self.advantage_shaping not in SHAPING_METHODS:
            fail(
                "advantage_shaping",
                f"unknown shaping {self.advantage_shaping!r}; choose one of "
                f"{list(SHAPING_METHODS)} ('tempsamp' with gt_guidance: true is TempSamp-R1).",
            )
        if not (math.isfinite(self.sample_weight_mean_power) and self.sample_weight_mean_power >= 0):
            fail(
                "sample_weight_mean_power",
                f"must be a number >= 0 (0: off; TimeLens2: 2), got {self.sample_weight_mean_power}.",
            )
        if self.sample_weight_mean_power > 0 and not self.sample_weight_file:
            fail(
                "sample_weight_file",
                f"not set, but sample_weight_mean_power is {self.sample_weight_mean_power}; point it at the "
                "per-query mean IoUs of the starting model (curate's per_query.jsonl), or set the power to 0.",
            )
        if self.train_vision_merger and not self.freeze_vision_tower:
            fail(
                "train_vision_merger",
                "only applies with freeze_vision_tower: true (without it the whole vision module trains).",
            )
        if self.gt_guidance and self.advantage_shaping == "none":
            import logging

            logging.getLogger(__name__).warning(
                "gt_guidance is on with advantage_shaping: none. TempSamp-R1 (Table 4) found this the worst variant "
                "(R1@0.5 63.0 against 68.9 for plain GRPO on Charades-STA); set advantage_shaping: tempsamp."
            )


# The transformers GenerationConfig keys a recipe's eval_generation_kwargs may set, and their checks.
EVAL_GENERATION_KEYS = ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "repetition_penalty")
SAMPLING_ONLY_KEYS = ("temperature", "top_p", "top_k")


def check_generation_kwargs(kwargs: dict | str | None) -> dict | None:
    """``eval_generation_kwargs`` checked (names, types, ranges) and parsed from JSON if a string; raises
    ValueError saying what is wrong and how to fix it. Checked when the recipe is parsed, not at the first
    ``generate`` after minutes of model loading."""
    if kwargs is None:
        return None
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs)
        except json.JSONDecodeError as err:
            raise ValueError(f"is not valid JSON ({err.msg}): {kwargs!r}") from None
    if not isinstance(kwargs, dict):
        raise ValueError(
            f"must map GenerationConfig keys to values, e.g. {{max_new_tokens: 512}}; got {kwargs!r}."
        )
    unknown = sorted(set(kwargs) - set(EVAL_GENERATION_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; allowed: {list(EVAL_GENERATION_KEYS)}.")

    def is_number(value) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

    def is_count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    checks = {
        "do_sample": (lambda v: isinstance(v, bool), "true or false"),
        "temperature": (lambda v: is_number(v) and v > 0, "a number > 0"),
        "top_p": (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
        "top_k": (lambda v: is_count(v) and v >= 1, "an integer >= 1"),
        "max_new_tokens": (lambda v: is_count(v) and v >= 1, "an integer >= 1"),
        "repetition_penalty": (lambda v: is_number(v) and v > 0, "a number > 0 (1.0: off)"),
    }
    for key, value in kwargs.items():
        valid, what = checks[key]
        if not valid(value):
            raise ValueError(f"{key} must be {what}, got {value!r}.")
    sampling = [key for key in SAMPLING_ONLY_KEYS if key in kwargs]
    if sampling and kwargs.get("do_sample") is not True:
        raise ValueError(
            f"{sampling} only act when sampling; add do_sample: true (top_k: 1 then decodes greedily, as "
            "TimeLens2's VLMEvalKit does) or remove them."
        )
    return dict(kwargs)


class DataToolArguments(GRPOScriptArguments):
    """A recipe as the tools that only read data see it (data check, preprocess, evaluation's loader): every
    check except importing reward plug-ins, which a data machine may lack or be slow to import. Training parses
    GRPOScriptArguments itself, so a bad plug-in still fails there before the model loads."""

    import_reward_plugins = False


# transformers 5.24's deprecated names of TrainingArguments fields -> their current names. The recipes use the
# current ones; a flag keeps beating the recipe whichever name it is given in (transformers takes the current name
# over the alias, so `--gradient_checkpointing true` over `activation_checkpointing: false` would be dropped).
RENAMED_FLAGS = {
    "--gradient_checkpointing": "--activation_checkpointing",
    "--gradient_checkpointing_kwargs": "--activation_checkpointing_kwargs",
}


def current_flag_names(args: list[str] | None) -> list[str]:
    """The command line (``sys.argv[1:]`` when None) with each deprecated field name of :data:`RENAMED_FLAGS`
    replaced by its current name, for ``TrlParser.parse_args_and_config``."""
    import sys

    renamed = []
    for arg in sys.argv[1:] if args is None else args:
        name, equals, value = arg.partition("=")
        renamed.append(RENAMED_FLAGS[name] + equals + value if name in RENAMED_FLAGS else arg)
    return renamed


def script_args_from_yaml(path: str, **overrides) -> GRPOScriptArguments:
    """Only the GRPOScriptArguments part of a recipe, without importing its reward plug-ins: for tools (data
    check, preprocess) that load no model and compute no reward."""
    import yaml

    with open(path) as f:
        recipe = yaml.safe_load(f) or {}
    names = {f.name for f in fields(GRPOScriptArguments)}
    values = {k: v for k, v in recipe.items() if k in names}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return DataToolArguments(**values)


def validate_recipe(script_args: GRPOScriptArguments, training_args, model_args) -> None:
    """Checks across the three dataclasses and the file system, run before any model loads."""
    import os

    def fail(name: str, why: str) -> None:
        raise ValueError(f"{name}: {why}")

    if not model_args.model_name_or_path:
        fail("model_name_or_path", "not set; e.g. Qwen/Qwen2.5-VL-7B-Instruct or a local directory.")
    if not script_args.train_file and not script_args.train_sources:
        fail("train_file", "not set; point it at the training annotations (or declare train_sources).")
    for name in ("train_file", "eval_file", "durations_file", "sample_weight_file"):
        path = getattr(script_args, name)
        if path and not os.path.isfile(path):
            fail(name, f"{path!r} does not exist.")
    if script_args.video_root and not os.path.isdir(script_args.video_root):
        fail("video_root", f"{script_args.video_root!r} is not a directory.")
    check_sources(script_args)
    if script_args.eval_file:
        from video_grpo.data.sources import eval_source

        check_source_format(eval_source(script_args), "eval_file")
    if script_args.sample_weight_mean_power > 0 and not training_args.shuffle_dataset:
        fail(
            "shuffle_dataset",
            "is false, but sample_weight_mean_power > 0 draws the queries at random by weight; set "
            "shuffle_dataset: true or sample_weight_mean_power: 0.",
        )
    strategy = getattr(training_args.eval_strategy, "value", training_args.eval_strategy)
    if strategy != "no" and not script_args.eval_file:
        fail("eval_strategy", f"is {strategy!r} but eval_file is not set; set eval_file or use 'no'.")
    if getattr(training_args, "use_vllm", False):
        fail(
            "use_vllm",
            "vLLM rollouts do not support video here yet: TRL 1.16 sends vLLM the prompt token ids "
            "without the frames (it forwards images only), so the policy would answer without seeing the video. "
            "Set use_vllm: false; generation then runs in transformers with the video.",
        )
    check_report_to(training_args.report_to)
    check_decode_launch(script_args, training_args)
    if training_args.trust_remote_code:
        import logging

        logging.getLogger(__name__).warning(
            "trust_remote_code is on: the model repository may run its own code."
        )
    # Last, as it reads the model's config.json (not its weights): the family sets what a frame costs.
    from video_grpo.inputs.families import family_of_model

    family = family_of_model(
        model_args.model_name_or_path, model_args.model_revision, training_args.trust_remote_code
    )
    check_video_budget(script_args, family)
    family.with_text_timestamps(script_args.frame_timestamps_in_text)  # an error on Qwen3-VL / Qwen3.5
    if script_args.shared_prefix:
        check_shared_prefix(model_args, training_args.trust_remote_code)


def check_sources(script_args: GRPOScriptArguments) -> None:
    """Each training source's files, directory and format (``train_sources`` or the one ``train_file``), before
    the model loads; an error names the source's field and the fix."""
    from video_grpo.data.sources import missing_source_paths, recipe_sources

    sources = recipe_sources(script_args)
    if script_args.train_sources:
        problems = missing_source_paths(sources)
        if problems:
            raise ValueError(problems[0])
    for source in sources:
        check_source_format(source, source.field("train_file"))


def check_source_format(source, name: str) -> None:
    """The annotation format of ``source`` is known or detectable, and a Charades-STA .txt has its durations."""
    from video_grpo.data.annotations import AnnotationError, detect_format

    fmt_field, durations_field = source.field("dataset_format"), source.field("durations_file")
    if name == "eval_file":
        fmt_field, durations_field = "dataset_format", "durations_file"
    if source.dataset_format is None:
        try:
            detect_format(source.train_file)
        except AnnotationError as err:
            raise ValueError(f"{fmt_field}: {err}") from None
    is_charades_txt = source.dataset_format == "charades_txt" or str(source.train_file).endswith(".txt")
    if is_charades_txt and not source.durations_file:
        raise ValueError(
            f"{durations_field}: {name} is a Charades-STA .txt; set {durations_field} to the Charades CSV."
        )


def check_decode_launch(script_args: GRPOScriptArguments, training_args) -> None:
    """``decode_compile: true`` where the launch cannot compile the step (ZeRO-3 without
    ``ds3_gather_for_generation``: ``video_grpo.rollout.decode.decode_settings`` decides) fails here, before the model
    loads; the launch's ZeRO stage is in the environment ``accelerate launch`` gives its processes."""
    if script_args.decode_compile != "true":
        return
    from video_grpo.rollout.decode import decode_settings
    from video_grpo.runtime.launch_env import launch_from_environment

    zero_stage = launch_from_environment()["zero_stage"]
    settings, why = decode_settings(
        script_args.decode_compile_backend,
        "cpu",
        zero_stage=zero_stage,
        gather_for_generation=training_args.ds3_gather_for_generation,
    )
    if settings is None:
        raise ValueError(
            f"decode_compile: true, but {why} (ZeRO-3 from the accelerate config). Set "
            "ds3_gather_for_generation: true, or decode_compile: auto (off here) or false."
        )


def check_shared_prefix(model_args, trust_remote_code: bool = False) -> None:
    """``shared_prefix: true`` where it cannot be exact fails here, before the weights load."""
    from transformers import AutoConfig

    from video_grpo.inputs.prefix import unsupported_reason

    config = AutoConfig.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision, trust_remote_code=trust_remote_code
    )
    reason = unsupported_reason(config, model_args.attn_implementation or "sdpa")
    if reason:
        raise ValueError(
            f"shared_prefix: true cannot be exact here: {reason}. Set shared_prefix: false (or leave it "
            "unset, which turns it off here with a warning)"
            + ("" if "attn_implementation" not in reason else ", or use attn_implementation: sdpa")
            + "."
        )


def check_video_budget(script_args: GRPOScriptArguments, family) -> None:
    """The frame-size and token-budget settings against the model family's token size (28 or 32 px)."""

    def fail(name: str, why: str) -> None:
        raise ValueError(f"{name}: {why}")

    per_token, pair, side = family.pixels_per_token, family.temporal_patch, family.size_multiple
    if script_args.video_min_pixels < per_token:
        fail(
            "video_min_pixels",
            f"must be >= {per_token} (one {side}x{side} token of {family.name}), got "
            f"{script_args.video_min_pixels}.",
        )
    min_frames = script_args.video_min_frames
    floor_frames = max(pair, min_frames + (-min_frames) % pair)
    floor_tokens = floor_frames // pair * (script_args.video_min_pixels // per_token)
    if script_args.video_max_tokens < floor_tokens:
        fail(
            "video_max_tokens",
            f"{script_args.video_max_tokens} cannot hold even video_min_frames={min_frames} "
            f"frames at video_min_pixels={script_args.video_min_pixels} ({floor_tokens} {family.name} tokens); raise "
            f"it to at least {floor_tokens} or lower those two.",
        )
    reachable = pair * (script_args.video_max_tokens // (script_args.video_min_pixels // per_token))
    if script_args.video_max_frames > reachable:
        fail(
            "video_max_frames",
            f"{script_args.video_max_frames} frames can never fit video_max_tokens="
            f"{script_args.video_max_tokens}: even at video_min_pixels={script_args.video_min_pixels} at most "
            f"{reachable} frames fit ({family.name}). Lower video_max_frames to {reachable} or raise video_max_tokens.",
        )


# report_to backend -> (modules of which one must import, pip package to install)
REPORT_BACKENDS = {
    "tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
    "wandb": (("wandb",), "wandb"),
    "mlflow": (("mlflow",), "mlflow"),
    "comet_ml": (("comet_ml",), "comet-ml"),
    "trackio": (("trackio",), "trackio"),
    "swanlab": (("swanlab",), "swanlab"),
}


def check_report_to(report_to) -> None:
    """Each ``report_to`` backend must be importable, or the trainer's constructor fails after the model loaded."""
    import importlib.util

    backends = [report_to] if isinstance(report_to, str) else list(report_to or [])
    for backend in backends:
        if backend not in REPORT_BACKENDS:
            continue  # "none", "all", or a backend transformers itself reports on
        modules, package = REPORT_BACKENDS[backend]
        if not any(importlib.util.find_spec(module) for module in modules):
            raise ValueError(
                f"report_to: {backend!r} needs the {package!r} package, which is not installed; "
                f"`pip install {package}` or set report_to to another backend (or none)."
            )
