"""Build a tiny, random-weight Qwen2.5-VL with its own processor, offline and deterministically.

    python -m video_grpo.tiny outputs/tiny-qwen2_5_vl

Tests and the demo cannot download ``Qwen/Qwen2.5-VL-*``, so they use this model. It is the real
``Qwen2_5_VLForConditionalGeneration`` architecture (3-D mrope, windowed vision tower, patch merger), only
small. The tokenizer is a byte-level BPE trained on grounding-style text, with Qwen's special tokens and a
ChatML template that renders a video block as ``<|vision_start|><|video_pad|><|vision_end|>``.

Why the vocabulary is small: a random-weight policy samples close to uniformly over the vocabulary. With a
few hundred tokens, where ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` and `` to `` are single
tokens, some of the 8 completions in a group hit a tag and others don't, so graded rewards differ within a
group and GRPO has a learning signal from step one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

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

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _training_corpus() -> list[str]:
    """Text the BPE merges are learned from: prompts, answers, numbers."""
    from video_grpo.configs import DEFAULT_PROMPT

    colours = ["red", "green", "blue", "yellow"]
    shapes = ["square", "circle"]
    lines = []
    for colour in colours:
        for shape in shapes:
            lines.append(DEFAULT_PROMPT.format(sentence=f"a {colour} {shape} moves across the screen"))
    for start in range(0, 60, 3):
        end = start + 7
        lines.append(f"<think>the event is from {start}.5 to {end}.0 seconds</think><answer>{start}.5 to {end}.0</answer>")
    lines.append("You are a helpful assistant. person opens the door, picks up a phone, sits on a chair.")
    return lines * 4


def build_processor(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        Qwen2_5_VLProcessor,
        Qwen2TokenizerFast,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

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
    pixel_kwargs = {"min_pixels": 4 * 28 * 28, "max_pixels": 256 * 28 * 28}
    image_processor = Qwen2VLImageProcessor(**pixel_kwargs)
    video_processor = Qwen2VLVideoProcessor(**pixel_kwargs)
    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def build_config(tokenizer, text_hidden: int = 64, text_layers: int = 2, vision_hidden: int = 32,
                 vision_depth: int = 2, text_intermediate: int | None = None):
    from transformers import Qwen2_5_VLConfig

    heads = 4
    head_dim = text_hidden // heads
    # mrope splits head_dim/2 rotary frequencies into (temporal, height, width) sections.
    half = head_dim // 2
    mrope_section = [half - 2 * (half // 3), half // 3, half // 3]
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in SPECIAL_TOKENS}
    return Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": text_hidden,
            "intermediate_size": text_intermediate or text_hidden * 2,
            "num_hidden_layers": text_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 2,
            "max_position_embeddings": 32768,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section},
            "tie_word_embeddings": False,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden,
            "intermediate_size": vision_hidden * 2,
            "num_heads": 2,
            "out_hidden_size": text_hidden,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [vision_depth - 1],
            "tokens_per_second": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def build_tiny_model(output_dir: str | Path, seed: int = 0, **config_kwargs) -> Path:
    """Write a tiny model + processor to ``output_dir`` and return the path. Same seed, same weights."""
    from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration

    output_dir = Path(output_dir)
    processor = build_processor()
    config = build_config(processor.tokenizer, **config_kwargs)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.text_config.eos_token_id],
        pad_token_id=config.text_config.pad_token_id,
        do_sample=True,
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir, safe_serialization=True)
    processor.save_pretrained(output_dir)
    n_params = sum(p.numel() for p in model.parameters())
    (output_dir / "tiny_model_info.json").write_text(
        json.dumps({"seed": seed, "parameters": n_params, "vocab_size": len(processor.tokenizer)}, indent=2)
    )
    return output_dir


def main() -> None:
    parser = argparse.ArgumentParser(description="Build a tiny random-weight Qwen2.5-VL for tests and the demo.")
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = build_tiny_model(args.output_dir, seed=args.seed)
    info = json.loads((path / "tiny_model_info.json").read_text())
    print(f"tiny Qwen2.5-VL written to {path} ({info['parameters']:,} parameters, vocab {info['vocab_size']})")


if __name__ == "__main__":
    main()
