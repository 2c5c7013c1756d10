"""Qwen2.5-VL at the published 3B and 7B widths (or narrower), random weights, depth cut to a few layers: the
model the shared-prompt and SDPA-kernel rows measure, and the one source of those widths for
``scripts/bench_gpu.py`` and ``tests/test_real_widths.py``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO.parent / "shared" / "reference" / "qwen2_5_vl"

# Qwen2.5-VL-3B-Instruct and -7B-Instruct hub config.json values that set the compute (the files in REFERENCE
# are read instead whenever they are present).
QWEN_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
}
QWEN_TOKENS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
# placeholder and special ids inside a 4,096-token vocabulary (the small-vocabulary widths, synthetic prompts)
SMALL_VOCAB_TOKENS = {
    "image_token_id": 4090,
    "video_token_id": 4091,
    "vision_start_token_id": 4092,
    "vision_end_token_id": 4093,
    "bos_token_id": 4094,
    "eos_token_id": 4095,
}
WIDTHS = {
    "3b": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "rope_theta": 1000000.0,
    },
    "7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "rope_theta": 1000000.0,
    },
    # narrower layers for --quick and the scaling table (same head size and MLP proportion as 3B)
    "narrow": {
        "hidden_size": 512,
        "intermediate_size": 2752,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "rope_theta": 1000000.0,
        "vision": {"hidden_size": 320, "intermediate_size": 855, "num_heads": 4},
    },
    # --quick: seconds per side, a synthetic prompt in a small vocabulary
    "quick": {
        "hidden_size": 128,
        "intermediate_size": 688,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 4096,
        "tie_word_embeddings": True,
        "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
        "rope_theta": 1000000.0,
        "vision": {"hidden_size": 64, "intermediate_size": 171, "num_heads": 2},
        "tokens": SMALL_VOCAB_TOKENS,
    },
}
# the scaling table: "narrow" with a small vocabulary, so that the LM head (the same on both sides) does not
# dominate a 1-layer model's step and hide how the prompt's share grows (a synthetic prompt)
WIDTHS["scaling"] = {**WIDTHS["narrow"], "vocab_size": 4096, "tokens": SMALL_VOCAB_TOKENS}
REFERENCE_FILES = {"3b": REFERENCE / "3B" / "config.json", "7b": REFERENCE / "config.json"}


def published_config(widths: str, reference: bool = True) -> tuple[dict, str]:
    """Qwen2.5-VL config.json values at ``widths``, full depth, and where they came from: the file in
    ``REFERENCE`` when ``reference`` and it is present, else the literals above. The one source of the 3B and 7B
    widths for the benchmarks, ``scripts/bench_gpu.py`` and ``tests/test_real_widths.py``."""
    source = REFERENCE_FILES.get(widths)
    if reference and source is not None and source.is_file():
        values = json.loads(source.read_text())
        values.pop("architectures", None)
        return values, str(source.relative_to(REPO.parent))
    spec = dict(WIDTHS[widths])
    vision = {**QWEN_VISION, **spec.pop("vision", {}), "out_hidden_size": spec["hidden_size"]}
    values = {
        **QWEN_TOKENS,
        **spec.pop("tokens", {}),
        **spec,
        "model_type": "qwen2_5_vl",
        "vision_config": vision,
    }
    return values, "literal" if widths in REFERENCE_FILES else f"{widths} (narrower than 3B)"


def model_config(widths: str, text_layers: int = 1, vision_layers: int = 1):
    """A Qwen2.5-VL config at ``widths`` with the depth cut to ``text_layers`` + ``vision_layers``."""
    from transformers import Qwen2_5_VLConfig

    values, origin = published_config(widths)
    values["num_hidden_layers"] = text_layers
    values["vision_config"] = {
        **values["vision_config"],
        "depth": vision_layers,
        "fullatt_block_indexes": [vision_layers - 1],
    }
    config = Qwen2_5_VLConfig(**values)
    config._attn_implementation = "sdpa"
    return config, origin


def build_model(config, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A random-weight Qwen2.5-VL of ``config``, with Qwen's reference position layout, scored as the trainer
    scores (see :func:`scoring_model`)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from video_grpo.inputs import positions

    positions.install()
    return scoring_model(Qwen2_5_VLForConditionalGeneration, config, device, dtype)


def scoring_model(model_class, config, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A random-weight ``model_class`` of ``config`` (seed 0) that scores a group as the trainer does: the vision
    tower once per video on both sides, and TRL's fused, chunked LM head (never the full logits)."""
    from video_grpo.inputs.encoder import install

    torch.manual_seed(0)
    model = model_class._from_config(config, dtype=dtype).to(device)
    install(model)
    try:
        from trl.trainer.utils import add_fused_lm_head
    except ImportError:
        model.fused_head = False
    else:
        add_fused_lm_head(model)
        model.fused_head = True
    return model
