"""A model's sizes for the planner, from its ``config.json`` alone: parameters by part, layer shapes, KV cache.

The parameter counts are exact: the model is built on PyTorch's ``meta`` device (shapes, no storage, no weights
read), so whatever transformers builds for the config is what is counted, in every family.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from video_grpo.families import ModelFamily, detect_family

DEFAULT_LORA_TARGETS = (
    "q_proj",
    "v_proj",
)  # PEFT's default for Qwen2/Qwen3 when lora_target_modules is unset


def load_model_config(
    model: str, model_config: str | None = None, revision: str | None = None, local_only: bool = True
):
    """A transformers config from ``model_config`` (a config.json or its folder), else from ``model`` (a local
    folder or a Hub id in the local cache; with ``local_only=False``, its config.json may be downloaded)."""
    from transformers import AutoConfig

    source = model_config or model
    path = Path(source)
    try:
        if path.is_file():
            values = json.loads(path.read_text())
            values.pop("architectures", None)
            values.pop("transformers_version", None)
            return AutoConfig.for_model(values.pop("model_type"), **values)
        return AutoConfig.from_pretrained(source, revision=revision, local_files_only=local_only)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(
            f"cannot read the config of {source!r} without downloading ({err}). Pass --model_config with the "
            "model's config.json (configs/models/ has the published ones of the supported models)."
        ) from err


def meta_model(config, dtype: torch.dtype = torch.bfloat16):
    """The model of ``config`` on the meta device: every parameter's shape and dtype, no storage.

    Inside a ZeRO-3 launch transformers wraps ``from_config`` in ``deepspeed.zero.Init``, which broadcasts every
    parameter to the other ranks; the planner runs on rank 0 alone, so that broadcast would have no partner and
    the launch would abort. ``set_zero3_state`` tells transformers that ZeRO-3 init is already handled."""
    from transformers import AutoModelForImageTextToText
    from transformers.modeling_utils import set_zero3_state

    with torch.device("meta"), set_zero3_state():
        return AutoModelForImageTextToText.from_config(config, dtype=dtype)


@dataclass(frozen=True, eq=False)  # hashed by identity: the planner caches layer traces per shape
class ModelShape:
    """What the planner needs of an architecture."""

    family: ModelFamily
    config: object = field(repr=False, compare=False)
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


def read_model_shape(config) -> ModelShape:
    """The :class:`ModelShape` of a transformers config (any supported family)."""
    family = detect_family(config)
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
    return ModelShape(
        linear_layers=linear_layers,
        family=family,
        config=config,
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
