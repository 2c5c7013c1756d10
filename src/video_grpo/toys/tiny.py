"""Build a tiny, random-weight video-language model with its own processor, offline and deterministically.

    python -m video_grpo.toys.tiny outputs/tiny-qwen2_5_vl
    python -m video_grpo.toys.tiny outputs/tiny-qwen3_vl --family qwen3_vl
    python -m video_grpo.toys.tiny outputs/tiny-qwen3_5 --family qwen3_5

Tests and the demo cannot download ``Qwen/*`` checkpoints, so they use these models. Each is the real
transformers architecture of its family, only small:

- ``qwen2_5_vl``: ``Qwen2_5_VLForConditionalGeneration`` (3-D mrope with time in the positions, windowed
  vision tower, 14-px patches) and ``Qwen2_5_VLProcessor``;
- ``qwen3_vl``: ``Qwen3VLForConditionalGeneration`` (interleaved mrope, time written into the prompt as
  ``<t seconds>`` text, 16-px patches, DeepStack features added to the first text layers) and
  ``Qwen3VLProcessor``;
- ``qwen3_5``: ``Qwen3_5ForConditionalGeneration`` (the Qwen3-VL vision tower without DeepStack, and a
  hybrid text model of gated delta-net linear-attention layers and gated full-attention layers; runs on CPU
  through transformers' pure-torch kernels) and ``Qwen3VLProcessor``.

All families share one tokenizer recipe: a byte-level BPE trained on grounding-style text, with Qwen's
special tokens, and a chat template that renders a video block as ``<|vision_start|><|video_pad|><|vision_end|>``
the way the family's published template does (Qwen2.5-VL adds a default system prompt; Qwen3-VL does not;
Qwen3.5 trims message text and opens the answer with an empty think block unless ``enable_thinking=True``).

Why the vocabulary is small: a random-weight policy samples close to uniformly over the vocabulary. With a
few hundred tokens, where ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` and `` to `` are single
tokens, some of the 8 completions in a group hit a tag and others don't, so graded rewards differ within a
group and GRPO has a learning signal from step one.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from video_grpo.inputs.families import FAMILIES

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Plain added tokens: they must survive `skip_special_tokens=True` decoding, so they are not "special".
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]


def _render_parts(match_keys: bool) -> str:
    """Jinja that renders ``message['content']`` parts. ``match_keys``: a part is also recognised by its key
    (``{'video': ...}``), as the Qwen3 templates do, not only by ``type``."""

    def test(kind: str) -> str:
        return f"part['type'] == '{kind}'" + (f" or '{kind}' in part" if match_keys else "")

    text_test = "'text' in part" if match_keys else "part['type'] == 'text'"
    return (
        "{% for part in message['content'] %}"
        "{% if " + test("video") + " %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
        "{% elif " + test("image") + " %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
        "{% elif " + text_test + " %}{{ part['text'] }}"
        "{% endif %}{% endfor %}"
    )


def _chatml(parts: str, default_system: bool) -> str:
    return (
        "{% for message in messages %}"
        + (
            "{% if loop.first and message['role'] != 'system' %}"
            "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
            "{% endif %}"
            if default_system
            else ""
        )
        + "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}" + parts + "{% endif %}"
        "{{ '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


# Qwen2.5-VL: a default system prompt when the conversation has none.
CHAT_TEMPLATE = _chatml(_render_parts(match_keys=False), default_system=True)
# Qwen3-VL (Instruct): no default system prompt.
QWEN3_VL_CHAT_TEMPLATE = _chatml(_render_parts(match_keys=True), default_system=False)
# Qwen3.5 (small models, "nothink" default): message text is trimmed, and the generation prompt closes an empty
# think block unless enable_thinking=True, which opens one instead. Assistant turns are rendered as plain text
# (the published template also moves their reasoning into a think block; prompts here hold no assistant turns).
QWEN3_5_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text %}" + _render_parts(match_keys=True) + "{% endset %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (text | trim) + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is true %}{{ '<think>\\n' }}"
    "{% else %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)


@dataclass(frozen=True)
class TinyBuilder:
    """What differs between the families when building a tiny model (their geometry and time encoding are in
    :mod:`video_grpo.inputs.families`)."""

    name: str
    model_class: str  # transformers class name
    processor_class: str
    video_processor_class: str
    image_processor_kwargs: dict
    video_processor_kwargs: dict
    chat_template: str


_SMALL_PIXELS_14 = {"min_pixels": 4 * 28 * 28, "max_pixels": 256 * 28 * 28}
# Published Qwen3-VL / Qwen3.5 processors: 16-px patches, 2x2 merge, 2-frame temporal patches, mean/std 0.5, video
# sampled at 2 fps (4..768 frames). Pixel budgets are scaled down for 112..128-px test frames; for the video
# processor they count pixels over the whole clip (frames x height x width), as in the published config.
_QWEN3_NORM = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
_QWEN3_PATCHES = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}
_QWEN3_IMAGE = {
    **_QWEN3_PATCHES,
    **_QWEN3_NORM,
    "size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 256 * 32 * 32},
}
_QWEN3_VIDEO = {
    **_QWEN3_PATCHES,
    **_QWEN3_NORM,
    "size": {"shortest_edge": 4 * 32 * 32, "longest_edge": 64 * 128 * 128},
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
}

BUILDERS: dict[str, TinyBuilder] = {
    "qwen2_5_vl": TinyBuilder(
        "qwen2_5_vl",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen2_5_VLProcessor",
        "Qwen2VLVideoProcessor",
        _SMALL_PIXELS_14,
        _SMALL_PIXELS_14,
        CHAT_TEMPLATE,
    ),
    "qwen3_vl": TinyBuilder(
        "qwen3_vl",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLProcessor",
        "Qwen3VLVideoProcessor",
        _QWEN3_IMAGE,
        _QWEN3_VIDEO,
        QWEN3_VL_CHAT_TEMPLATE,
    ),
    "qwen3_5": TinyBuilder(
        "qwen3_5",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3VLProcessor",
        "Qwen3VLVideoProcessor",
        _QWEN3_IMAGE,
        _QWEN3_VIDEO,
        QWEN3_5_CHAT_TEMPLATE,
    ),
}


def get_builder(family: str) -> TinyBuilder:
    if family not in BUILDERS:
        raise ValueError(f"unknown model family {family!r}; supported: {', '.join(BUILDERS)}")
    return BUILDERS[family]


def _training_corpus() -> list[str]:
    """Text the BPE merges are learned from: prompts, answers, numbers."""
    from video_grpo.data.prompts import DEFAULT_PROMPT

    colours = ["red", "green", "blue", "yellow"]
    shapes = ["square", "circle"]
    lines = []
    for colour in colours:
        for shape in shapes:
            lines.append(DEFAULT_PROMPT.format(sentence=f"a {colour} {shape} moves across the screen"))
    for start in range(0, 60, 3):
        end = start + 7
        lines.append(
            f"<think>the event is from {start}.5 to {end}.0 seconds</think><answer>{start}.5 to {end}.0</answer>"
        )
    lines.append("You are a helpful assistant. person opens the door, picks up a phone, sits on a chair.")
    return lines * 4


def build_tokenizer(vocab_size: int = 320):
    """The shared tiny tokenizer: byte-level BPE + Qwen special tokens + the answer tags as plain added tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_corpus(), trainer=trainer)
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        model_max_length=32768,
    )
    tokenizer.add_tokens(TAG_TOKENS)
    return tokenizer


def build_processor(vocab_size: int = 320, family: str = "qwen2_5_vl"):
    import transformers

    spec = get_builder(family)
    processor_class = getattr(transformers, spec.processor_class)
    return processor_class(
        image_processor=transformers.Qwen2VLImageProcessor(**spec.image_processor_kwargs),
        tokenizer=build_tokenizer(vocab_size),
        video_processor=getattr(transformers, spec.video_processor_class)(**spec.video_processor_kwargs),
        chat_template=spec.chat_template,
    )


def _token_ids(tokenizer) -> dict:
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "text": {
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
    }


def _mrope_section(rotary_dim: int) -> list[int]:
    """Split rotary_dim/2 frequencies into (temporal, height, width) sections, as the published configs do."""
    half = rotary_dim // 2
    return [half - 2 * (half // 3), half // 3, half // 3]


def build_config(
    tokenizer,
    text_hidden: int = 64,
    text_layers: int | None = None,
    vision_hidden: int = 32,
    vision_depth: int = 2,
    text_intermediate: int | None = None,
    family: str = "qwen2_5_vl",
):
    """A tiny config of ``family`` whose placeholder ids are ``tokenizer``'s (0.2-0.3M parameters by default).

    ``text_layers`` defaults to 2, and to 3 for ``qwen3_vl``: DeepStack adds vision features after text layers
    0, 1, ..., and features added after the last layer cannot reach a later token, so the tiny model keeps one
    text layer above its DeepStack levels for every DeepStack merger to get a gradient."""
    import transformers

    get_builder(family)  # an unknown family fails here, naming the supported ones
    if text_layers is None:
        text_layers = 3 if family == "qwen3_vl" else 2
    ids = _token_ids(tokenizer)
    heads, kv_heads = 4, 2
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": text_hidden,
        "intermediate_size": text_intermediate or text_hidden * 2,
        "num_hidden_layers": text_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        **ids["text"],
    }
    vision = {
        "depth": vision_depth,
        "hidden_size": vision_hidden,
        "intermediate_size": vision_hidden * 2,
        "num_heads": 2,
        "out_hidden_size": text_hidden,
        "patch_size": FAMILIES[family].patch_size,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
    }
    tokens = {
        k: ids[k]
        for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    }
    if family == "qwen2_5_vl":
        head_dim = text_hidden // heads
        text["rope_parameters"] = {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": _mrope_section(head_dim),
        }
        vision.update(window_size=112, fullatt_block_indexes=[vision_depth - 1], tokens_per_second=2)
        return transformers.Qwen2_5_VLConfig(
            text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens
        )
    # Qwen3-VL / Qwen3.5 vision: learned position grid (a square; 2304 = 48x48 published, 8x8 here) + 2-D rope.
    vision.update(hidden_act="gelu_pytorch_tanh", num_position_embeddings=64)
    if family == "qwen3_vl":
        head_dim = text_hidden // heads
        text.update(
            head_dim=head_dim,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_interleaved": True,
                "mrope_section": _mrope_section(head_dim),
            },
        )
        # DeepStack: merged features of these vision layers are added after text layers 0, 1, ... (published 8B:
        # vision layers [8, 16, 24] of 27). Here up to 3 levels, below the last text layer.
        levels = max(1, min(3, vision_depth, text_layers - 1))
        vision["deepstack_visual_indexes"] = list(range(vision_depth - levels, vision_depth))
        return transformers.Qwen3VLConfig(
            text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens
        )
    # Qwen3.5: gated attention with a partial rotary (a quarter of head_dim) and linear-attention layers; the
    # published models put one full-attention layer after every three linear ones. Here: linear, then full.
    head_dim = 2 * text_hidden // heads
    layer_types = ["linear_attention" if (i + 1) % 2 else "full_attention" for i in range(text_layers)]
    layer_types[-1] = "full_attention"
    text.update(
        head_dim=head_dim,
        layer_types=layer_types,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": _mrope_section(head_dim // 4),
        },
    )
    return transformers.Qwen3_5Config(
        text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens
    )


def build_tiny_model(
    output_dir: str | Path, seed: int = 0, family: str = "qwen2_5_vl", **config_kwargs
) -> Path:
    """Write a tiny model + processor of ``family`` to ``output_dir`` and return the path. Same seed, same weights.

    ``config_kwargs`` go to :func:`build_config` (text_hidden, text_layers, vision_hidden, vision_depth,
    text_intermediate)."""
    import transformers
    from transformers import GenerationConfig

    spec = get_builder(family)
    output_dir = Path(output_dir)
    processor = build_processor(family=family)
    config = build_config(processor.tokenizer, family=family, **config_kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, spec.model_class)(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.text_config.eos_token_id],
        pad_token_id=config.text_config.pad_token_id,
        do_sample=True,
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir, safe_serialization=True)
    processor.save_pretrained(output_dir)
    n_params = sum(p.numel() for p in model.parameters())
    info = {"seed": seed, "parameters": n_params, "vocab_size": len(processor.tokenizer)}
    if family != "qwen2_5_vl":  # keep the Qwen2.5-VL file as it always was
        info["family"] = family
    (output_dir / "tiny_model_info.json").write_text(json.dumps(info, indent=2))
    return output_dir


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Build a tiny random-weight video-language model for tests and the demo."
    )
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=list(BUILDERS), default="qwen2_5_vl")
    args = parser.parse_args()
    path = build_tiny_model(args.output_dir, seed=args.seed, family=args.family)
    info = json.loads((path / "tiny_model_info.json").read_text())
    print(
        f"tiny {args.family} written to {path} ({info['parameters']:,} parameters, vocab {info['vocab_size']})"
    )


if __name__ == "__main__":
    main()
