"""GPU benchmark: random-weight, full-size Qwen2.5-VL-3B at real video sizes, plain vs encode-once.

Times the training forward+backward of one GRPO micro-batch set (P prompts x G generations, each with one
video), with the vision encoder run per row (plain, as TRL does) and once per video (video_grpo). No
download: the architecture is built from the published 3B dimensions with random weights, so the numbers are
about compute, not quality. Prints JSON lines like `python -m video_grpo.bench`.

    python scripts/bench_gpu.py                       # on a GPU: 3B, 32 frames of 448x448, G=8
    python scripts/bench_gpu.py --tiny --device cpu   # a seconds-long smoke run of the same code
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from video_grpo.bench.emit import emit
from video_grpo.bench.qwen_widths import published_config
from video_grpo.inputs.encoder import install
from video_grpo.plan.memory import plan_memory
from video_grpo.plan.model import read_model_shape
from video_grpo.plan.workload import Workload

# Qwen2.5-VL-3B-Instruct's config.json (the reference file when present, else bench.qwen_widths' literal widths).
QWEN_3B = published_config("3b")[0]
TINY = {  # the same layout at toy widths, for a CPU smoke run
    **QWEN_3B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "vision_config": {
        **QWEN_3B["vision_config"],
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "fullatt_block_indexes": [1],
    },
}


def build_batch(args, config, device):
    """P prompts x G rows: text, one video's placeholder tokens, more text, then a completion."""
    patch, merge = 14, 2
    grid = torch.tensor([[args.frames // 2, args.height // patch, args.width // patch]])
    video_tokens = int(grid.prod()) // merge**2
    rows = []
    pixels = []
    for _ in range(args.prompts):
        video = torch.randn(int(grid.prod()), 3 * 2 * patch * patch)
        ids = [1000] * 40 + [config.vision_start_token_id] + [config.video_token_id] * video_tokens
        ids += [config.vision_end_token_id] + [1001] * 60 + [1002] * args.completion
        rows += [ids] * args.G
        pixels += [video] * args.G
    input_ids = torch.tensor(rows, device=device)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values_videos": [p.to(device) for p in pixels],
        "video_grid_thw": grid.repeat(len(rows), 1).to(device),
        "second_per_grid_ts": torch.ones(len(rows), device=device),
        "mm_token_type_ids": (input_ids == config.video_token_id).long() * 2,
    }, video_tokens


def step(model, batch, micro_batch: int, completion: int) -> None:
    rows = batch["input_ids"].shape[0]
    for start in range(0, rows, micro_batch):
        end = min(rows, start + micro_batch)
        inputs = {
            k: (v[start:end] if torch.is_tensor(v) else torch.cat(v[start:end])) for k, v in batch.items()
        }
        logits = model(**inputs, logits_to_keep=completion + 1).logits
        logits.float().logsumexp(-1).mean().backward()


def planned_peak_gib(config, args, video_tokens: int, text_tokens: int, encode_once: bool) -> float:
    """What ``video_grpo.plan`` predicts for this step on CUDA: the loss phase of a one-process workload of the same
    rows (bf16 weights and gradients resident, checkpointing on, every row its own prompt), less the optimizer
    states, which this step has none of. Its LM head is TRL's chunked one; this step keeps the last
    ``completion + 1`` logits per row instead, a few hundred MB at the 3B vocabulary."""
    merge = config.vision_config.spatial_merge_size
    pairs = args.frames // 2
    work = Workload(
        visual_tokens=video_tokens,
        temporal_patches=pairs,
        frame_tokens=(args.height // 14) * (args.width // 14) // merge**2,
        text_tokens=text_tokens,
        completion_tokens=args.completion,
        group_size=args.G,
        micro_batch_rows=min(args.micro_batch, args.G * args.prompts),
        generation_rows=args.G * args.prompts,
        gradient_accumulation=max(1, args.G * args.prompts // args.micro_batch),
        shared_prefix=False,
        encode_once=encode_once,
        gradient_checkpointing=True,
        dtype=args.dtype,
        mixed_precision=False,
    )
    loss = plan_memory(read_model_shape(config), work, "cuda").phases["loss"]
    return (loss.peak - loss.by_category.get("optimizer states", 0)) / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--height", type=int, default=448)
    parser.add_argument("--width", type=int, default=448)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiny", action="store_true", help="small dimensions, for a smoke run")
    args = parser.parse_args()
    if args.tiny:
        args.frames, args.height, args.width, args.completion = 4, 56, 56, 8
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    config = Qwen2_5_VLConfig(**(TINY if args.tiny else QWEN_3B))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    batch, video_tokens = build_batch(args, config, device)
    results = {}
    for mode in ("plain", "once"):
        model = Qwen2_5_VLForConditionalGeneration(config).to(device=device, dtype=dtype)
        model.activation_checkpointing_enable()
        model.train()
        if mode == "once":
            install(model)
        step(model, batch, args.micro_batch, args.completion)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        for _ in range(args.steps):
            model.zero_grad(set_to_none=True)
            step(model, batch, args.micro_batch, args.completion)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / args.steps
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
        results[mode] = (seconds, peak)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    samples = batch["input_ids"].shape[0]
    setting = {
        "model": "tiny" if args.tiny else "Qwen2.5-VL-3B (random weights)",
        "frames": args.frames,
        "frame_size": f"{args.height}x{args.width}",
        "video_tokens": video_tokens,
        "G": args.G,
        "prompts": args.prompts,
        "completion_tokens": args.completion,
        "device": str(device),
        "dtype": args.dtype,
    }
    once, plain = results["once"], results["plain"]
    emit("gpu_train_samples_per_s", samples / once[0], samples / plain[0], "samples/s", **setting)
    text_tokens = 40 + 2 + 60  # build_batch's text around the video
    planned = {
        mode: round(planned_peak_gib(config, args, video_tokens, text_tokens, mode == "once"), 2)
        for mode in ("once", "plain")
    }
    emit(
        "gpu_peak_memory_planned", planned["once"], planned["plain"], "GiB (video_grpo.plan, CUDA)", **setting
    )
    if once[1] is not None:
        emit("gpu_peak_memory", once[1], plain[1], "GiB", planned_gib=planned, **setting)
        # the planner beside torch.cuda.max_memory_allocated, per side: ratio = measured / planned
        for mode, measured in (("once", once[1]), ("plain", plain[1])):
            emit(f"gpu_peak_memory_vs_plan_{mode}", measured, planned[mode], "GiB", **setting)


if __name__ == "__main__":
    main()
