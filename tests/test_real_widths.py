"""Real widths, reduced depth: one real GRPO step per model family at the published layer sizes.

The tiny models of the other tests have 32-64-wide layers and a 324-token vocabulary; they cannot show that a
step fits, or even runs, when tensors have their real shapes (a 151,936- or 248,320-row embedding, 128- and
256-wide attention heads, a 1024-1280-wide vision tower with 14- or 16-px patches, interleaved mrope
sections, DeepStack at 2048 wide (its forward; see ``LAYERS`` for its backward), Qwen3.5's 16-head gated delta
net). Here each family is built from its published config with every width kept and only the depth cut to one
layer of each kind (``LAYERS``: a layer's shapes do not depend on how many follow it, so a second layer of the
same kind would prove little more and cost as much as the first; the exception is Qwen3-VL's DeepStack merger,
whose backward needs a text layer after the one it feeds and so does not run here), random weights, saved to a
temporary folder, loaded by ``VideoGRPOTrainer`` from that path, and trained for one step: G = 2 answers of 8 tokens to one query about a 640x360, 30 fps, 4 s clip
(ffmpeg ``testsrc2``), sampled at 2 fps (8 frames) and sized by the sampler within the recipes' per-frame pixel
range (16-256 visual tokens per frame pair), which gives 880-1008 visual tokens.

What is real and what is not:

- **Widths**: Qwen2.5-VL-3B-Instruct from ``../shared/reference/qwen2_5_vl/3B/config.json`` (its hub config;
  the literal below is the fallback when the file is absent). Qwen3-VL-2B-Instruct and Qwen3.5-0.8B from the
  literals below, each with its source. Depth: reduced, see each builder.
- **Processor**: Qwen2.5-VL: the real processor, chat template and tokenizer from
  ``../shared/reference/qwen2_5_vl`` (the 7B files; 3B ships the same tokenizer). Qwen3-VL and Qwen3.5: no
  published processor is available offline, so a ``Qwen3VLProcessor`` is built from the real Qwen2.5-VL BPE
  plus the four added tokens Qwen3 has after it (``<tool_response>``, ``</tool_response>``, ``<think>``,
  ``</think>`` at 151665-151668), the published Qwen3-VL image/video processor settings, and the published chat
  templates as TRL ships them (``qwen3_vl``; ``qwen3_5_nothink``, which Qwen3.5-2B and smaller ship). For
  Qwen3-VL this is its real tokenizer layout as far as we know (the special-token ids equal the published
  config's). For Qwen3.5 it is NOT its tokenizer: Qwen3.5 has its own 248k vocabulary (video pad 248057 in the
  published config); the model keeps the published 248,320-row embedding but its placeholder ids are the
  stand-in tokenizer's.
- **Weights**: random. The video: synthetic.

Without ``../shared/reference`` (or with ``VIDEO_GRPO_NO_REFERENCE=1``) the tests still run: Qwen2.5-VL
widths come from the literal, and every family uses the tiny BPE of :mod:`video_grpo.toys.tiny` (324 tokens) with
the family's tiny chat template instead of the real tokenizer; the model keeps its real vocabulary size.

Each test takes about a minute and 4-7 GB of memory on a 2-core CPU (fp32, no gradient checkpointing, SGD so
no optimizer state); the numbers are printed. Marked ``launch`` (slow).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import time
import zlib

import pytest
import torch
import trl.trainer.utils
from transformers import AutoProcessor, GenerationConfig
from transformers.initialization import no_init_weights
from trl import GRPOConfig

from video_grpo.bench.qwen_widths import published_config
from video_grpo.configs import script_args_from_yaml
from video_grpo.data.dataset import build_dataset
from video_grpo.data.video import SamplingConfig
from video_grpo.inputs.families import FAMILIES
from video_grpo.rewards.functions import completion_text, iou_reward
from video_grpo.trainer import VideoGRPOTrainer

from .conftest import REFERENCE, REPO
from .test_trainer import ForwardProbe, vision_snapshot
from .test_video_formats import ffmpeg

pytestmark = pytest.mark.launch

QWEN_DIR = REFERENCE / "qwen2_5_vl"
USE_REFERENCE = (QWEN_DIR / "vocab.json").is_file() and not os.environ.get("VIDEO_GRPO_NO_REFERENCE")
# The depth cut, (text layers, vision layers): one of each kind; the widths are the published ones. Qwen2.5-VL: one
# text layer, vision layers 0 (windowed) and 1 (full attention). Qwen3-VL: one of each, vision layer 0 feeding
# DeepStack into text layer 0 (added after the last text layer, it reaches only the visual positions' logits, so
# its merger gets no gradient from the answer here; tests/test_families.py checks that it does in a deeper
# model). Qwen3.5: text [linear_attention, full_attention], one vision layer.
LAYERS = {"qwen2_5_vl": (1, 2), "qwen3_vl": (1, 1), "qwen3_5": (2, 1)}
FRAMES = 8  # a 4 s clip at 2 fps

# Qwen3-VL-2B-Instruct. No copy of its hub config.json with a citable repository and path was found offline.
# - Text (2048 hidden, 6144 MLP, 28 layers, 16 heads / 8 kv of 128, 151,936 vocab, tied, theta 5e6, interleaved
#   mrope [24, 20, 20], 262,144 positions): UNATTRIBUTED; the same values in several independent stored copies
#   of that config (e.g. a Rust test fixture of the "official checkpoint shape", find_string id 69166798289),
#   listed in /work/qwen3_findings.md section 3.
# - Vision (24 layers, 1024 hidden, 4096 MLP, 16 heads, DeepStack [5, 11, 17], 16-px patches, 2304 position
#   grid): InternLM/xtuner xtuner/v1/model/compose/qwen3_vl/qwen3_vl_config.py @062ecf47, Qwen3VLDense4BConfig
#   (2B and 4B share the tower); out_hidden_size = the text width, as the merger's output feeds the text model.
# - Placeholder ids 151655/151656/151652/151653: the same xtuner file (Qwen3VLBaseConfig).
QWEN3_VL_2B = {
    "text_config": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_interleaved": True,
            "mrope_section": [24, 20, 20],
        },
    },
    "vision_config": {
        "depth": 24,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_heads": 16,
        "out_hidden_size": 2048,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [5, 11, 17],
        "hidden_act": "gelu_pytorch_tanh",
    },
    "tie_word_embeddings": True,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
}

# Qwen3.5-0.8B: the config.json of Qwen/Qwen3.5-0.8B at hub revision 2fc06364, as quoted (minus token ids) in a
# stored third-party test (find_string id 71269929174; the tool does not name its repository). Text: 24 layers,
# 3 linear-attention (gated delta net, 16 key / 16 value heads of 128, conv 4) to 1 gated full-attention
# (8 heads / 2 kv of 256, a quarter of each head rotary), 3584 MLP, 248,320 vocab, tied, theta 1e7, interleaved
# mrope [11, 11, 10]. Vision: the Qwen3-VL tower without DeepStack at 768 wide, 12 layers.
QWEN3_5_0_8B = {
    "text_config": {
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "num_hidden_layers": 24,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "vocab_size": 248320,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "layer_types": ["linear_attention"] * 3
        + ["full_attention"],  # repeated 6 times in the published config
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 16,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
        },
    },
    "vision_config": {
        "depth": 12,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_heads": 12,
        "out_hidden_size": 1024,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "num_position_embeddings": 2304,
        "hidden_act": "gelu_pytorch_tanh",
    },
    "tie_word_embeddings": True,
}

# Published Qwen3-VL processor settings (preprocessor_config.json and video_preprocessor_config.json), as quoted
# by several stored third-party copies (repositories not named by the search tool; /work/qwen3_findings.md 1b).
# Qwen3.5 uses the same processor classes. The video sizes bound pixels of a whole clip; with pre-sized frames
# (do_resize=False, as video_grpo calls it) only patch, merge and normalisation matter.
QWEN3_PATCHES = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
QWEN3_IMAGE_PROCESSOR = {**QWEN3_PATCHES, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
QWEN3_VIDEO_PROCESSOR = {
    **QWEN3_PATCHES,
    "size": {"shortest_edge": 4096, "longest_edge": 25165824},
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
}
# Qwen3's added tokens after Qwen2.5's last one (<|file_sep|> 151664): a stored copy of Qwen3-4B's
# tokenizer_config.json (akougkas/warpio-cli warpio-docs/ai-docs/model_cards/qwen3:4b.md); Qwen3-VL shares it.
QWEN3_ADDED_TOKENS = {
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}

# Per-frame pixel range of the recipes (configs/grpo/): 16..256 visual tokens per frame pair.
RECIPES = {
    "qwen2_5_vl": REPO / "configs/grpo/qwen2_5_vl_7b_charades.yaml",
    "qwen3_vl": REPO / "configs/grpo/qwen3_vl_8b_charades.yaml",
    "qwen3_5": REPO / "configs/grpo/qwen3_5_4b_charades.yaml",
}  # each family's own recipe (Qwen3-VL's and Qwen3.5's share the 32-px geometry)
# What the sampler makes of the 640x360 clip under those bounds, and the visual tokens that follow.
EXPECTED = {
    "qwen2_5_vl": {"frame": (336, 588), "tokens": 4 * 12 * 21},
    "qwen3_vl": {"frame": (352, 640), "tokens": 4 * 11 * 20},
    "qwen3_5": {"frame": (352, 640), "tokens": 4 * 11 * 20},
}


def crc_reward(completions, **kwargs) -> list[float]:
    """Differs between any two different answers, so G = 2 random answers have nonzero advantages."""
    return [zlib.crc32(completion_text(c).encode()) % 1000 / 1000 for c in completions]


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """A 4 s, 640x360, 30 fps H.264 clip and a one-query annotation file next to it."""
    folder = tmp_path_factory.mktemp("clip")
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=640x360:rate=30:duration=4",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        str(folder / "clip.mp4"),
    )
    record = {
        "id": "clip_0",
        "video": "clip.mp4",
        "duration": 4.0,
        "solution": [1.0, 2.5],
        "sentence": "the moving pattern changes colour",
    }
    (folder / "train.jsonl").write_text(json.dumps(record) + "\n")
    return folder / "train.jsonl"


@pytest.fixture(scope="module")
def qwen_processor_dir(tmp_path_factory):
    """The real Qwen2.5-VL processor, saved once with the tokenizer.json the reference lacks (building it from
    vocab.json + merges.txt takes ~10 s), or None without the reference."""
    if not USE_REFERENCE:
        return None
    folder = tmp_path_factory.mktemp("qwen2_5_vl_processor")
    AutoProcessor.from_pretrained(QWEN_DIR).save_pretrained(folder)
    return folder


def qwen3_processor(family: str, reference_dir):
    import transformers
    from trl.chat_template_utils import qwen3_5_nothink_chat_template, qwen3_vl_chat_template

    from video_grpo.toys import tiny

    if reference_dir is None:
        tokenizer = tiny.build_tokenizer()
        template = tiny.get_builder(family).chat_template
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(reference_dir)
        tokenizer.add_tokens(list(QWEN3_ADDED_TOKENS))  # plain added tokens, as in Qwen3's tokenizer
        assert {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN3_ADDED_TOKENS} == QWEN3_ADDED_TOKENS
        template = qwen3_vl_chat_template if family == "qwen3_vl" else qwen3_5_nothink_chat_template
    return transformers.Qwen3VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(**QWEN3_IMAGE_PROCESSOR),
        video_processor=transformers.Qwen3VLVideoProcessor(**QWEN3_VIDEO_PROCESSOR),
        tokenizer=tokenizer,
        chat_template=template,
    )


def placeholder_ids(tokenizer) -> dict:
    names = {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    }
    return {key: tokenizer.convert_tokens_to_ids(token) for key, token in names.items()}


def special_ids(tokenizer) -> dict:
    end, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return {"bos_token_id": pad, "eos_token_id": end, "pad_token_id": pad}


def qwen2_5_vl_model(reference_dir):
    """Qwen2.5-VL-3B widths; one text layer (all are alike); vision layers 0 (windowed) and 1 (full attention;
    published: every 8th of 32)."""
    import transformers

    # Qwen2.5-VL-3B-Instruct's config.json (../shared/reference/qwen2_5_vl/3B, see SOURCES.md), else the same
    # widths as bench.qwen_widths' literal
    published, _ = published_config("3b", reference=USE_REFERENCE)
    text_layers, vision_layers = LAYERS["qwen2_5_vl"]
    published = {
        **published,
        "num_hidden_layers": text_layers,
        "vision_config": {
            **published["vision_config"],
            "depth": vision_layers,
            "fullatt_block_indexes": [vision_layers - 1],
        },
    }
    if reference_dir is None:
        from video_grpo.toys import tiny

        processor = tiny.build_processor(family="qwen2_5_vl")
        published.update(placeholder_ids(processor.tokenizer), **special_ids(processor.tokenizer))
    else:
        processor = AutoProcessor.from_pretrained(reference_dir)
        assert placeholder_ids(processor.tokenizer)["video_token_id"] == published["video_token_id"] == 151656
    config = transformers.Qwen2_5_VLConfig.from_dict(published)
    return transformers.Qwen2_5_VLForConditionalGeneration, config, processor


def qwen3_model(family: str, reference_dir):
    """Qwen3-VL-2B / Qwen3.5-0.8B widths, one vision layer (all are alike). Qwen3-VL: one text layer, DeepStack
    at vision layer 0 (the published [5, 11, 17] of 24, scaled to 1 layer), added after text layer 0. Qwen3.5:
    text layers [linear_attention, full_attention], one of each kind."""
    import transformers

    processor = qwen3_processor(family, reference_dir)
    published = QWEN3_VL_2B if family == "qwen3_vl" else QWEN3_5_0_8B
    text_layers, vision_layers = LAYERS[family]
    text = {**published["text_config"], "num_hidden_layers": text_layers, **special_ids(processor.tokenizer)}
    vision = {**published["vision_config"], "depth": vision_layers}
    if family == "qwen3_vl":
        vision["deepstack_visual_indexes"] = sorted({int(i * vision_layers / 24) for i in (5, 11, 17)})
        assert vision["deepstack_visual_indexes"] == [0]
    else:
        text["layer_types"] = ["linear_attention", "full_attention"]
    ids = placeholder_ids(processor.tokenizer)
    if family == "qwen3_vl" and reference_dir is not None:
        assert ids == {k: published[k] for k in ids}  # the stand-in tokenizer has the published ids
    config_class = transformers.Qwen3VLConfig if family == "qwen3_vl" else transformers.Qwen3_5Config
    config = config_class(
        text_config=text, vision_config=vision, tie_word_embeddings=published["tie_word_embeddings"], **ids
    )
    model_class = (
        transformers.Qwen3VLForConditionalGeneration
        if family == "qwen3_vl"
        else transformers.Qwen3_5ForConditionalGeneration
    )
    return model_class, config, processor


def build_real_width_model(family: str, folder, reference_dir):
    """Build, save in bf16 (half the disk; TRL loads it back as float32), and free the model."""
    model_class, config, processor = (
        qwen2_5_vl_model(reference_dir) if family == "qwen2_5_vl" else qwen3_model(family, reference_dir)
    )
    torch.manual_seed(0)
    # Random weights drawn once: the layers' own constructors would draw every matrix (kaiming) before
    # transformers' init_weights draws it again (normal, std 0.02), a third of the build's CPU here.
    with no_init_weights():
        model = model_class(config)
    model.init_weights()
    parameters = sum(p.numel() for p in model.parameters())
    model.generation_config = GenerationConfig(
        eos_token_id=[config.text_config.eos_token_id],
        pad_token_id=config.text_config.pad_token_id,
        do_sample=True,
    )
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    del model
    return parameters


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_one_grpo_step_at_real_widths(family, clip, qwen_processor_dir, tmp_path, monkeypatch):
    # TRL's fused LM head scores only the completion positions on Triton devices (GPUs) and every position
    # elsewhere, so on a CPU it would project all ~1150 prompt positions onto the whole vocabulary (about 45 of the
    # ~75 s of this step). Take the GPU's branch; the log-probs it returns for the completion are the same.
    monkeypatch.setattr(trl.trainer.utils, "_use_triton", lambda device: True)
    start = time.perf_counter()
    model_dir = tmp_path / f"real-width-{family}"
    parameters = build_real_width_model(family, model_dir, qwen_processor_dir)
    built = time.perf_counter()

    args = script_args_from_yaml(str(RECIPES[family]))
    fam = FAMILIES[family]
    sampling = SamplingConfig.from_args(args, fam)
    assert (
        sampling.fps == 2.0
        and sampling.min_pixels
        <= 16 * fam.pixels_per_token
        < 256 * fam.pixels_per_token
        <= sampling.max_pixels
    )  # the recipes' per-frame range
    dataset = build_dataset(clip, sampling=sampling)
    trainer = VideoGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[crc_reward, iou_reward],
        args=GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=8,
            max_steps=1,
            learning_rate=1e-2,
            optim="sgd",
            beta=0.0,
            bf16=False,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            gradient_checkpointing=False,
            logging_steps=1,
            loss_type="grpo",
            seed=0,
            dataloader_num_workers=0,
            model_init_kwargs={"dtype": "float32"},
        ),
        train_dataset=dataset,
        processing_class=AutoProcessor.from_pretrained(model_dir),
    )
    probe, before = ForwardProbe(trainer.model), vision_snapshot(trainer.model)
    loaded = time.perf_counter()
    result = trainer.train()
    trained = time.perf_counter()

    # the step ran, its loss is finite, and the vision tower, down to its patch embedding, was trained
    assert trainer.state.global_step == 1 and math.isfinite(result.training_loss)
    assert probe.encoder_calls_with_grad >= 1
    moved = {
        name.split(".")[0]
        for name, p in trainer.model.model.visual.named_parameters()
        if not torch.equal(before[name], p.detach())
    }
    assert {"patch_embed", "blocks", "merger"} <= moved, moved

    # the prompt holds one <|video_pad|> per visual token of the grid, and the grid is the sampled frames'
    loss_forward = probe.loss_forwards[0]
    grid = loss_forward["video_grid_thw"]
    frame = dataset[0]["video_frames"].shape
    patch = fam.patch_size
    assert frame[0] == FRAMES and tuple(frame[-2:]) == EXPECTED[family]["frame"]
    # G = 2 rows of one prompt: one packed row with shared_prefix (on where exact), two without (Qwen3.5)
    rows = loss_forward["input_ids"].shape[0]
    assert rows == (1 if trainer.shared_prefix else 2)
    assert grid.tolist() == [[FRAMES // 2, frame[-2] // patch, frame[-1] // patch]] * rows
    pads = (loss_forward["input_ids"] == trainer.video_token_id).sum(dim=1)
    assert pads.tolist() == [EXPECTED[family]["tokens"]] * rows == [int(grid[0].prod()) // 4] * rows

    tokenizer = trainer.processing_class.tokenizer
    prompt = tokenizer.decode(loss_forward["input_ids"][0])
    stamps = re.findall(r"<(\d+\.\d) seconds>", prompt)
    if fam.time_in_text:  # one "<t seconds>" per temporal patch: the mean time of its two frames
        times = dataset[0]["video_metadata"]["timestamps"]
        assert stamps == [f"{(times[k] + times[k + 1]) / 2:.1f}" for k in range(0, FRAMES, 2)]
        assert len(stamps) == int(grid[0][0]) and [float(s) for s in stamps] == pytest.approx(
            [0.25, 1.25, 2.25, 3.25], abs=0.051
        )
    else:
        assert stamps == [] and loss_forward["second_per_grid_ts"].tolist() == pytest.approx(
            [1.0] * rows, rel=1e-3
        )

    print(
        f"\n{family}: {parameters / 1e6:.0f}M parameters, {EXPECTED[family]['tokens']} visual tokens, prompt "
        f"{loss_forward['input_ids'].shape[1]} tokens with the completion; build+save {built - start:.1f} s, "
        f"load {loaded - built:.1f} s, step {trained - loaded:.1f} s, total {trained - start:.1f} s; "
        f"peak RSS of this process so far {rss_gb():.1f} GB; loss {result.training_loss:.4g}; "
        f"{'real' if USE_REFERENCE else 'tiny fallback'} tokenizer"
    )
