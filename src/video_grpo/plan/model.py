"""A model's sizes for the planner, from its ``config.json`` alone: parameters by part, layer shapes, KV cache.

The parameter counts are exact: the model is built on PyTorch's ``meta`` device (shapes, no storage, no weights
read), so whatever transformers builds for the config is what is counted, in every family.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from video_grpo.inputs.families import ModelFamily, detect_family

if TYPE_CHECKING:
    import torch

DEFAULT_LORA_TARGETS = (
    "q_proj",
    "v_proj",
)  # PEFT's default for Qwen2/Qwen3 when lora_target_modules is unset


# The published config.json of each supported model, shipped in the repository (configs/models/index.json maps
# each Hub id to its file). Found beside the package in a checkout (``pip install -e .``, what the README says);
# a non-editable install does not carry configs/, so there the working directory's configs/models/ is used (the
# repository root, where the README's commands run), and without one the planner needs --model_config.
MODEL_CONFIGS = "configs/models"
INDEX = "index.json"


def shipped_configs_dir() -> Path | None:
    """The folder of the shipped model configs (the one holding ``index.json``), or None if there is none."""
    for root in (Path(__file__).resolve().parents[3], Path.cwd()):
        folder = root / MODEL_CONFIGS
        if (folder / INDEX).is_file():
            return folder
    return None


def shipped_model_configs() -> dict[str, Path]:
    """Hub id -> the shipped config.json of that model (empty when no folder is found)."""
    folder = shipped_configs_dir()
    if folder is None:
        return {}
    return {model: folder / name for model, name in json.loads((folder / INDEX).read_text()).items()}


def _shipped_list() -> str:
    """What the shipped folder holds, for an error message."""
    shipped = shipped_model_configs()
    if not shipped:
        return (
            f"no {MODEL_CONFIGS}/ folder was found beside the package or here (run from the repository root)"
        )
    return f"{MODEL_CONFIGS}/ has " + ", ".join(f"{path.name} ({model})" for model, path in shipped.items())


def _read_config_file(path: Path):
    from transformers import AutoConfig

    values = json.loads(path.read_text())
    values.pop("architectures", None)
    values.pop("transformers_version", None)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def load_model_config(
    model: str, model_config: str | None = None, revision: str | None = None, local_only: bool = True
) -> tuple[object, str | None]:
    """A transformers config, and a one-line note when it came from a shipped file the caller did not name.

    From ``model_config`` (a config.json or its folder) when given; else from ``model``: a local folder, a Hub id
    in the local cache (with ``local_only=False``, its config.json may be downloaded), and failing those the
    shipped config of that Hub id (``configs/models/``), so that planning a shipped recipe works offline."""
    from transformers import AutoConfig

    if model_config is not None:
        path = Path(model_config)
        if not path.exists():
            raise ValueError(
                f"--model_config {model_config}: no such file or folder; {_shipped_list()}. Pass one of them, "
                "or the config.json (or folder) of the model to plan."
            )
        try:
            return (_read_config_file(path) if path.is_file() else AutoConfig.from_pretrained(path)), None
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"--model_config {model_config}: not a model config.json ({err})") from err
    try:
        return AutoConfig.from_pretrained(model, revision=revision, local_files_only=local_only), None
    except (OSError, ValueError, KeyError) as err:
        shipped = shipped_model_configs().get(model)
        if shipped is None:
            reason = str(err).splitlines()[0]
            fallback = (
                "it is not one of the shipped model configs" if shipped_model_configs() else "none shipped"
            )
            local = (
                f" If {model!r} is meant as a local folder, there is none at {Path(model).resolve()}: the CPU "
                "recipes' tiny models are made by `make tiny` or `python -m video_grpo.toys.tiny DIR --family F`."
                if not Path(model).exists()
                else ""
            )
            raise ValueError(
                f"cannot read the config of {model!r} without downloading ({reason}), and {fallback}: "
                f"{_shipped_list()}. Pass --model_config with the model's config.json.{local}"
            ) from err
    note = (
        f"plan: {model}'s architecture from {MODEL_CONFIGS}/{shipped.name}, shipped with video_grpo "
        "(--model_config to plan another)"
    )
    return _read_config_file(shipped), note


def meta_model(config, dtype: torch.dtype | None = None):
    """The model of ``config`` on the meta device: every parameter's shape and dtype, no storage.

    Inside a ZeRO-3 launch transformers wraps ``from_config`` in ``deepspeed.zero.Init``, which broadcasts every
    parameter to the other ranks; the planner runs on rank 0 alone, so that broadcast would have no partner and
    the launch would abort. ``set_zero3_state`` tells transformers that ZeRO-3 init is already handled."""
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.modeling_utils import set_zero3_state

    dtype = dtype or torch.bfloat16
    with torch.device("meta"), set_zero3_state():
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    check_tied(model)
    return model


def check_tied(model) -> None:
    """Refuse a model whose config ties weights (the output projection to the input embedding) that were built
    apart: the plan would count the projection twice (a Qwen3.5-4B recipe: 2.4 GB more per GPU).

    transformers ties them when the model is built, unless ``PreTrainedModel.tie_weights`` is its loading-time
    no-op: ``from_pretrained`` swaps it in while it loads and puts back what it found, so two loads at once in
    threads can leave the no-op in place for the rest of the process (transformers PR #44940)."""
    get = model.get_parameter_or_buffer
    apart = [
        target for target, source in model.all_tied_weights_keys.items() if get(target) is not get(source)
    ]
    if apart:
        from transformers.modeling_utils import PreTrainedModel

        raise RuntimeError(
            f"the model built for planning has {', '.join(apart)} apart from what its config ties them to: weight "
            f"tying is switched off in this process (PreTrainedModel.tie_weights is "
            f"{PreTrainedModel.tie_weights.__qualname__}), which a from_pretrained running in another thread at the "
            "same time leaves behind. Plan in a fresh process (python -m video_grpo.plan)."
        )


@dataclass(frozen=True, eq=False)  # hashed by identity: the planner caches layer traces per shape
class ModelShape:
    """What the planner needs of an architecture."""

    family: ModelFamily
    load_config: Callable[[], object] = field(repr=False, compare=False)  # gives the transformers config
    vision_params: int
    language_params: int  # decoder layers, norms and the input embedding
    head_params: int  # the output projection when it is not tied to the input embedding
    embedding_params: int
    text_layer_params: dict[str, int]  # parameters of one decoder layer, by layer type
    vision_block_params: int  # parameters of one vision block
    largest_layer_params: int  # the largest single module ZeRO-3 gathers at once (often the embedding)
    hidden: int
    intermediate: int
    vocab: int
    text_layers: tuple[str, ...]  # layer type of each decoder layer ("full_attention", "linear_attention")
    heads: int
    kv_heads: int
    head_dim: int
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    patch_values: int  # floats per vision patch: channels x temporal patch x patch x patch
    merge: int
    out_hidden: int
    deepstack_levels: int
    windowed_blocks: int  # Qwen2.5-VL's window-attention blocks; the rest attend within a frame
    window_patches: int  # patches per window side (window_size / patch_size)
    linear_attention: dict = field(default_factory=dict)  # Qwen3.5's Gated DeltaNet sizes
    linear_layers: tuple[tuple[str, int], ...] = ()  # (name, in + out) of every language-model linear layer

    @functools.cached_property
    def config(self):
        """The model's transformers config, read when first asked: a plan whose measurements are all kept
        (:mod:`video_grpo.plan.cache`) never asks, and so imports neither transformers nor torch."""
        return self.load_config()

    @property
    def params(self) -> int:
        return self.vision_params + self.language_params + self.head_params

    @property
    def tied(self) -> bool:
        return self.head_params == 0

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes one token adds: keys and values of every full-attention layer."""
        full = sum(1 for kind in self.text_layers if kind != "linear_attention")
        return full * 2 * self.kv_heads * self.head_dim * dtype_bytes

    def linear_state_bytes(self) -> int:
        """Per row: the recurrent (fp32) and convolution states of every linear-attention layer (Qwen3.5)."""
        spec = self.linear_attention
        if not spec:
            return 0
        layers = sum(1 for kind in self.text_layers if kind == "linear_attention")
        recurrent = spec["value_heads"] * spec["key_dim"] * spec["value_dim"] * 4
        conv_channels = 2 * spec["key_heads"] * spec["key_dim"] + spec["value_heads"] * spec["value_dim"]
        return layers * (recurrent + conv_channels * (spec["conv_kernel"] - 1) * 2)

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """LoRA parameters PEFT adds for ``targets`` (module-name suffixes) at ``rank``: rank x (in + out) for
        each matching linear layer of the language model (the vision tower's are named otherwise)."""
        return rank * sum(size for name, size in self.linear_layers if name in targets)


@dataclass(frozen=True)
class ConfigFile:
    """A model's ``config.json``, found without transformers, and how :func:`load_model_config` reads it."""

    path: Path
    pretrained: bool  # AutoConfig.from_pretrained on its folder; else AutoConfig.for_model on its values
    note: str | None  # load_model_config's note

    def load(self):
        """The transformers config, as :func:`load_model_config` makes it from this file."""
        if self.pretrained:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(self.path.parent)
        return _read_config_file(self.path)

    def key(self) -> str:
        """The cache key of the model (:func:`video_grpo.plan.cache.file_key`)."""
        from video_grpo.plan import cache

        return cache.file_key(self.path.read_bytes(), self.pretrained)


def find_config_file(model: str, model_config: str | None, revision: str | None = None) -> ConfigFile | None:
    """The file :func:`load_model_config` reads (offline) for these arguments, found without importing
    transformers, or None where only transformers can tell: a Hub id the local Hugging Face cache holds (its
    revision is resolved there), or a path that is not there (whose error load_model_config words)."""
    if model_config is not None:
        path = Path(model_config)
        if path.is_file():
            return ConfigFile(path, False, None)
        return ConfigFile(path / "config.json", True, None) if (path / "config.json").is_file() else None
    if Path(model).is_dir():
        path = Path(model) / "config.json"
        return ConfigFile(path, True, None) if revision is None and path.is_file() else None
    from huggingface_hub.constants import HF_HUB_CACHE

    if (Path(HF_HUB_CACHE) / ("models--" + model.replace("/", "--"))).exists():
        return None
    shipped = shipped_model_configs().get(model)
    if shipped is None:
        return None
    note = (
        f"plan: {model}'s architecture from {MODEL_CONFIGS}/{shipped.name}, shipped with video_grpo "
        "(--model_config to plan another)"
    )
    return ConfigFile(shipped, False, note)


def read_model_shape(config, key: str | None = None) -> ModelShape:
    """The :class:`ModelShape` of a transformers config (any supported family), or of a :class:`ConfigFile`, read
    only if a number is not kept. Its numbers are measured on a meta model once per model
    (:mod:`video_grpo.plan.cache`), here or in an earlier process; ``key``: the model's cache key, if not the
    config's own (:func:`video_grpo.plan.cache.model_key`)."""
    from video_grpo.plan import cache

    if isinstance(config, ConfigFile):
        key, load = key or config.key(), config.load
    else:
        key, load = key or cache.model_key(config), (lambda config=config: config)
    family = detect_family(cache.cached(key, "model_type", lambda: load().model_type))
    measured = cache.cached(key, "shape", lambda: measure_shape(load()))
    shape = ModelShape(
        family=family,
        load_config=load,
        **{
            **measured,
            "text_layers": tuple(measured["text_layers"]),
            "linear_layers": tuple((name, size) for name, size in measured["linear_layers"]),
        },
    )
    cache.remember_shape(shape, key)
    return shape


def measure_shape(config) -> dict:
    """:func:`read_model_shape`'s numbers (every field but the family and the config), counted on the meta model."""
    import torch

    model = meta_model(config)
    text, vision = config.get_text_config(), config.vision_config

    def count(prefix: str) -> int:
        return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefix))

    embedding = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight
    tied = head is model.get_input_embeddings().weight
    layers = model.model.language_model.layers
    kinds = tuple(getattr(text, "layer_types", None) or ["full_attention"] * len(layers))
    per_kind: dict[str, int] = {}
    for kind, layer in zip(kinds, layers, strict=True):
        per_kind.setdefault(kind, sum(p.numel() for p in layer.parameters()))
    blocks = model.model.visual.blocks
    modules = [m for m in model.modules() if not list(m.children())]
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in modules)
    full_blocks = set(getattr(vision, "fullatt_block_indexes", None) or [])
    windowed = len(blocks) - len(full_blocks) if getattr(vision, "window_size", None) else 0
    heads = text.num_attention_heads
    linear = {}
    if "linear_attention" in kinds:
        linear = {
            "key_heads": text.linear_num_key_heads,
            "value_heads": text.linear_num_value_heads,
            "key_dim": text.linear_key_head_dim,
            "value_dim": text.linear_value_head_dim,
            "conv_kernel": text.linear_conv_kernel_dim,
        }
    linear_layers = tuple(
        (name.rsplit(".", 1)[-1], module.in_features + module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.startswith("model.language_model.")
    )
    return dict(
        linear_layers=linear_layers,
        vision_params=count("model.visual."),
        language_params=count("model.language_model."),
        head_params=0 if tied else head.numel(),
        embedding_params=embedding,
        text_layer_params=per_kind,
        vision_block_params=sum(p.numel() for p in blocks[0].parameters()),
        largest_layer_params=largest,
        hidden=text.hidden_size,
        intermediate=text.intermediate_size,
        vocab=text.vocab_size,
        text_layers=kinds,
        heads=heads,
        kv_heads=text.num_key_value_heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        vision_depth=len(blocks),
        vision_hidden=vision.hidden_size,
        vision_intermediate=vision.intermediate_size,
        vision_heads=vision.num_heads,
        patch_values=vision.in_channels * vision.temporal_patch_size * vision.patch_size**2,
        merge=vision.spatial_merge_size,
        out_hidden=vision.out_hidden_size,
        deepstack_levels=len(getattr(vision, "deepstack_visual_indexes", None) or []),
        windowed_blocks=windowed,
        window_patches=(getattr(vision, "window_size", 0) or 0) // vision.patch_size,
        linear_attention=linear,
    )
