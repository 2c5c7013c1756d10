"""The tiny model builder for each model family: build, reload, forward with a real video, generate, backward.

Qwen3-VL and Qwen3.5 write time into the prompt ("<t seconds>" before each temporal patch); these tests also pin
the transformers 5.24 processor behaviour that the video path has to work around (see
``test_qwen3_processor_timestamps_and_layout``).
"""

from __future__ import annotations

import json

import pytest
import torch

from video_grpo.inputs.families import FAMILIES
from video_grpo.toys.tiny import BUILDERS, build_config, build_processor, build_tiny_model, main

VIDEO = "data_samples/videos/train_000.mp4"
FAMILY_NAMES = list(BUILDERS)
MODEL_TYPES = {"qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl", "qwen3_5": "qwen3_5"}


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def tiny(request, tmp_path_factory):
    family = request.param
    path = build_tiny_model(tmp_path_factory.mktemp(family) / f"tiny-{family}", family=family)
    return family, path


def _load(path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    return AutoProcessor.from_pretrained(path), AutoModelForImageTextToText.from_pretrained(path)


def _sample_frames(multiple: int, count: int = 8):
    """``count`` frames spread over the sample video, resized to 4x4 tokens, and each frame's time in seconds."""
    import decord
    from torchvision.transforms.v2 import functional as tvf

    reader = decord.VideoReader(VIDEO, ctx=decord.cpu(0), num_threads=1)
    total, fps = len(reader), float(reader.get_avg_fps())
    indices = torch.linspace(0, total - 1, count).round().long().tolist()
    frames = torch.from_numpy(reader.get_batch(indices).asnumpy()).permute(0, 3, 1, 2)
    frames = tvf.resize(frames, [4 * multiple, 4 * multiple], antialias=True)
    times = reader.get_frame_timestamp(indices)[:, 0].tolist()
    return frames, {"fps": fps, "total_num_frames": total, "frames_indices": indices}, times


def _encode(processor, family: str):
    """Processor inputs for one sample video and a grounding prompt; frames are pre-sampled and pre-sized."""
    multiple = FAMILIES[family].patch_size * 2
    frames, metadata, times = _sample_frames(multiple)
    if (
        family != "qwen2_5_vl"
    ):  # explicit frame times: the processor writes (t[2k] + t[2k+1]) / 2 per temporal patch
        metadata = dict(metadata, fps=1.0, frames_indices=times)
    messages = [
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "When does it move?"}]}
    ]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return processor(
        text=[text],
        videos=[frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        do_resize=False,
        cap_pixels_per_frame=True,
        return_tensors="pt",
    ), times


def test_build_reload_forward_generate_backward(tiny):
    family, path = tiny
    info = json.loads((path / "tiny_model_info.json").read_text())
    assert 150_000 < info["parameters"] < 1_000_000
    processor, model = _load(path)
    assert model.config.model_type == MODEL_TYPES[family]
    assert info["parameters"] == sum(p.numel() for p in model.parameters())

    inputs, _ = _encode(processor, family)
    video_id = model.config.video_token_id
    assert int((inputs["input_ids"] == video_id).sum()) == int(inputs["video_grid_thw"].prod()) // 4
    assert torch.equal(inputs["mm_token_type_ids"] == 2, inputs["input_ids"] == video_id)
    outputs = model(**inputs)
    assert torch.isfinite(outputs.logits).all()

    placeholders = [
        model.config.image_token_id,
        video_id,
        model.config.vision_start_token_id,
        model.config.vision_end_token_id,
    ]
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=6, do_sample=False, suppress_tokens=placeholders)
    new = generated[0, inputs["input_ids"].shape[1] :]
    assert new.numel() > 0 and not set(new.tolist()) & set(placeholders)

    model.train()
    model(**inputs, labels=inputs["input_ids"]).loss.backward()
    vision_grad = sum(p.grad.abs().sum() for p in model.model.visual.parameters() if p.grad is not None)
    assert vision_grad > 0


def test_tokenizer_tags_and_video_processor(tiny):
    family, path = tiny
    processor, _ = _load(path)
    tokenizer = processor.tokenizer
    text = "<think>a</think><answer>1.5 to 3.0</answer>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert tag in tokenizer.convert_ids_to_tokens(ids)  # one token each
    assert tokenizer.decode(ids, skip_special_tokens=True) == text  # not special: kept when decoding
    video = processor.video_processor
    assert (
        video.patch_size == FAMILIES[family].patch_size
        and video.merge_size == 2
        and video.temporal_patch_size == 2
    )
    if family != "qwen2_5_vl":
        assert list(video.image_mean) == [0.5] * 3 and list(video.image_std) == [0.5] * 3 and video.fps == 2


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_5"])
def test_chat_template_renders_like_the_published_one(family):
    """Our tiny templates against the published Qwen3-VL / Qwen3.5 (small, "nothink") templates that TRL ships."""
    import trl.chat_template_utils as published

    processor = build_processor(family=family)
    real = (
        published.qwen3_vl_chat_template if family == "qwen3_vl" else published.qwen3_5_nothink_chat_template
    )
    video = {"type": "video"}
    conversations = [
        [{"role": "user", "content": [video, {"type": "text", "text": "When does it move?"}]}],
        [
            {"role": "system", "content": "Answer in seconds. "},
            {"role": "user", "content": [video, {"type": "text", "text": " hi \n"}]},
        ],
    ]
    options = [{}] if family == "qwen3_vl" else [{}, {"enable_thinking": True}, {"enable_thinking": False}]
    for messages in conversations:
        for kwargs in options:
            mine = processor.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **kwargs
            )
            theirs = processor.apply_chat_template(
                messages, chat_template=real, tokenize=False, add_generation_prompt=True, **kwargs
            )
            assert mine == theirs


def test_qwen3_processor_timestamps_and_layout():
    """transformers 5.24's Qwen3VLProcessor writes "<t seconds>" per temporal patch from frames_indices / fps (so
    explicit times go in as frames_indices with fps 1). It replaces only <|video_pad|>, so the template's
    <|vision_start|><|video_pad|><|vision_end|> ends up wrapped around the whole video; Qwen's reference layout
    (transformers 4.57, vLLM) replaces the whole triplet. Collapsing the triplet first gives the reference layout."""
    processor = build_processor(family="qwen3_vl")
    inputs, times = _encode(processor, "qwen3_vl")
    stamps = [f"<{(a + b) / 2:.1f} seconds>" for a, b in zip(times[::2], times[1::2], strict=True)]
    decoded = processor.tokenizer.decode(inputs["input_ids"][0])
    grid = inputs["video_grid_thw"][0].tolist()
    assert grid[0] == len(stamps) == 4
    pads = "<|video_pad|>" * (grid[1] * grid[2] // 4)
    block = "".join(f"{s}<|vision_start|>{pads}<|vision_end|>" for s in stamps)
    assert f"<|vision_start|>{block}<|vision_end|>" in decoded  # the 5.24 nesting (canary: fails once fixed)

    frames, metadata, _ = _sample_frames(32)
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "q"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    collapsed = text.replace("<|vision_start|><|video_pad|><|vision_end|>", "<|video_pad|>")
    fixed = processor(
        text=[collapsed],
        videos=[frames],
        video_metadata=[dict(metadata, fps=1.0, frames_indices=times)],
        do_sample_frames=False,
        do_resize=False,
        cap_pixels_per_frame=True,
        return_tensors="pt",
    )
    assert processor.tokenizer.decode(fixed["input_ids"][0]) == text.replace(
        "<|vision_start|><|video_pad|><|vision_end|>", block
    )


def test_qwen2_5_vl_callers_unchanged(tmp_path):
    """Existing callers pass Qwen2.5-VL sizes by keyword and get the same model as before (default family)."""
    path = build_tiny_model(
        tmp_path / "m", text_hidden=32, text_layers=1, vision_hidden=16, vision_depth=1, text_intermediate=48
    )
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_vl"
    assert config["text_config"]["hidden_size"] == 32 and config["text_config"]["intermediate_size"] == 48
    assert config["vision_config"]["depth"] == 1 and config["vision_config"]["fullatt_block_indexes"] == [0]
    assert "family" not in json.loads((path / "tiny_model_info.json").read_text())


def test_same_seed_same_weights_and_family_errors(tmp_path):
    from safetensors.torch import load_file

    a = load_file(build_tiny_model(tmp_path / "a", family="qwen3_vl") / "model.safetensors")
    b = load_file(build_tiny_model(tmp_path / "b", family="qwen3_vl") / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any("deepstack_merger_list" in k for k in a)
    with pytest.raises(ValueError, match="qwen2_5_vl, qwen3_vl, qwen3_5"):
        build_config(build_processor().tokenizer, family="llava")


def test_cli_family(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["video_grpo.toys.tiny", str(tmp_path / "m"), "--family", "qwen3_5"])
    main()
    assert "tiny qwen3_5 written to" in capsys.readouterr().out
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == "qwen3_5"
    assert config["text_config"]["layer_types"] == ["linear_attention", "full_attention"]
