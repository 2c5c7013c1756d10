"""Benchmark of the shared prompt (:mod:`video_grpo.inputs.prefix`, :mod:`video_grpo.rollout.prefill`): one group of G answers
to one video prompt, scored plain (G rows, each with the prompt) and packed (one row), side by side.

Called by ``python -m video_grpo.bench perf`` (rows ``lm_positions_per_forward``, ``train_step_time_shared_prefix``,
``peak_memory_shared_prefix``, ``generation_time_shared_prefill``, ``shared_prefix_scaling``, and from
:mod:`video_grpo.bench.shared_prefix_depth` ``train_step_time_shared_prefix_full_depth`` and
``peak_memory_shared_prefix_full_depth``) and, on a GPU, by
``scripts/bench_gpu.sh`` (``python -m video_grpo.bench.shared_prefix gpu``). Needs torch, transformers and ``src/``.

- **Model.** Qwen2.5-VL at the published 3B (or 7B) widths, read from ``../shared/reference/qwen2_5_vl`` when
  it is there (the literals below otherwise), random weights, depth cut in the real model's proportion (36 text
  to 32 vision layers, so 1 + 1). The scaling table uses narrower layers, ``--quick`` tiny ones and a small
  vocabulary (seconds per side).
- **Input.** A real clip of ``data_samples`` sampled to 16 frames sized for the visual-token count, through the
  real processor and chat template when ``../shared/reference/qwen2_5_vl`` has them (else a synthetic prompt of
  the same layout); G answers of random tokens with lengths spread over 32-128.
- **Step.** The same scoring as the trainer's forwards: per-token log-probs of the answer tokens only, through
  TRL's fused chunked LM head (without TRL, e.g. on a bare GPU machine, the same positions with materialised
  logits), loss = their mean, backward. The vision tower runs once per video on both
  sides (``video_grpo.inputs.encoder``), so the difference is the language model's prompt copies.
- **Time.** Each side runs two steps; the faster counts (both are in the JSON line's ``*_step_seconds``).
- **Memory.** Each side runs in a fresh process, measured on its first step. Before the step the weights and their gradients are resident;
  the row reports the peak of the resident set during forward + backward minus what was resident before (CPU,
  sampled every 2 ms), or ``max_memory_allocated`` minus the allocation before (CUDA).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from video_grpo.bench.emit import emit
from video_grpo.bench.group_scoring import answer_logps, group_inputs, timed_group_step
from video_grpo.bench.peak_memory import in_fresh_process
from video_grpo.bench.qwen_widths import WIDTHS, build_model, model_config
from video_grpo.bench.sdpa_kernel import sdpa_kernel_rows
from video_grpo.bench.shared_prefix_depth import full_depth_rows


def train_step(setting: dict) -> dict:
    """One side's loss forward + backward in this process; ``setting`` as :func:`run_side` passes it."""
    device, dtype = setting.get("device", "cpu"), getattr(torch, setting.get("dtype", "float32"))
    config, origin = model_config(
        setting["widths"], setting.get("text_layers", 1), setting.get("vision_layers", 1)
    )
    model = build_model(config, device, dtype)
    batch = group_inputs(config, setting["visual_tokens"], setting["G"], device=device)
    step = timed_group_step(model, batch, setting["shared"], device)
    return {**step, "config": origin, "prompt_source": batch["prompt_source"]}


def run_side(setting: dict) -> dict:
    """:func:`train_step` in a fresh process, so each side's memory starts from the same state."""
    return in_fresh_process("video_grpo.bench.shared_prefix", "train_step", setting)


def train_rows(
    emit, widths: str, visual_tokens: int, group_size: int, device: str = "cpu", dtype: str = "float32"
) -> None:
    setting = {
        "widths": widths,
        "visual_tokens": visual_tokens,
        "G": group_size,
        "device": device,
        "dtype": dtype,
    }
    shared, plain = run_side({**setting, "shared": True}), run_side({**setting, "shared": False})
    prompt, answers = plain["prompt_tokens"], plain["answers"]
    ideal = (prompt + sum(answers)) / (group_size * (prompt + max(answers)))
    common = {
        "model": f"Qwen2.5-VL {widths} widths, 1 text + 1 vision layer, random weights",
        "config": plain["config"],
        "prompt": plain["prompt_source"],
        "prompt_tokens": prompt,
        "visual_tokens": plain["visual_tokens"],
        "G": group_size,
        "answer_tokens": answers,
        "device": device,
        "dtype": dtype,
        "ours_setting": "shared_prefix",
        "baseline_setting": "plain (G rows)",
    }
    emit(
        "lm_positions_per_forward",
        shared["positions"],
        plain["positions"],
        "token positions",
        ideal=round(ideal, 4),
        goal="ratio within 5% of ideal",
        **common,
    )
    emit(
        "train_step_time_shared_prefix",
        shared["seconds"],
        plain["seconds"],
        "s per loss forward+backward",
        goal="ratio <= 0.35",
        ours_step_seconds=shared["step_seconds"],
        baseline_step_seconds=plain["step_seconds"],
        ours_samples_per_s=round(group_size / shared["seconds"], 3),
        baseline_samples_per_s=round(group_size / plain["seconds"], 3),
        **common,
    )
    emit(
        "peak_memory_shared_prefix",
        shared["peak_added_mb"],
        plain["peak_added_mb"],
        "MB added by forward+backward",
        goal="ratio <= 0.4",
        **common,
    )


def generation_row(
    emit,
    widths: str,
    visual_tokens: int,
    group_size: int,
    new_tokens: int = 64,
    device: str = "cpu",
    dtype: str = "float32",
) -> None:
    """``generate`` of G answers to one prompt: one prefill per row (plain) vs one per prompt."""
    from video_grpo.inputs.processing import video_kwargs
    from video_grpo.rollout import prefill

    config, origin = model_config(widths)
    model = build_model(config, device, getattr(torch, dtype)).eval()
    batch = group_inputs(config, visual_tokens, group_size, device=device)
    prompt = batch["input_ids"][:, : batch["prompt_tokens"]]
    inputs = {
        "input_ids": prompt,
        "attention_mask": torch.ones_like(prompt),
        **video_kwargs(batch["video_rows"], slice(None), prompt, config.video_token_id),
    }
    kwargs = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "pad_token_id": 0,
        "eos_token_id": config.get_text_config().eos_token_id,
    }
    with torch.no_grad():  # warm-up: one short generate on each path
        model.generate(**inputs, **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
        prefill.generate(model, **inputs, **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
    seconds, outputs = {}, {}
    for name in ("plain", "shared"):
        started = time.perf_counter()
        with torch.no_grad():
            outputs[name] = (
                prefill.generate(model, **inputs, **kwargs)
                if name == "shared"
                else model.generate(**inputs, **kwargs)
            )
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - started
    emit(
        "generation_time_shared_prefill",
        seconds["shared"],
        seconds["plain"],
        "s per generate",
        model=f"Qwen2.5-VL {widths} widths, 1 text + 1 vision layer, random weights",
        config=origin,
        prompt_tokens=batch["prompt_tokens"],
        G=group_size,
        new_tokens=new_tokens,
        device=device,
        dtype=dtype,
        same_tokens=bool(torch.equal(outputs["plain"], outputs["shared"])),
        goal="ratio <= 0.4",
    )


def scaling_rows(emit, visual_tokens=(1024, 2048, 4096), group_sizes=(4, 8, 16)) -> None:
    """The train-step ratio over prompt length and G, on the narrower model, in this process."""
    config, origin = model_config("scaling")
    model = build_model(config)
    for tokens in visual_tokens:
        for group_size in group_sizes:
            batch = group_inputs(config, tokens, group_size)
            seconds = {True: float("inf"), False: float("inf")}
            for shared in (True, False, True, False):  # the faster of two steps per side
                model.zero_grad(set_to_none=True)
                started = time.perf_counter()
                logps, _ = answer_logps(model, batch, shared)
                (-logps.mean()).backward()
                seconds[shared] = min(seconds[shared], time.perf_counter() - started)
            emit(
                "shared_prefix_scaling",
                seconds[True],
                seconds[False],
                "s per loss forward+backward",
                visual_tokens=batch["visual_tokens"],
                prompt_tokens=batch["prompt_tokens"],
                G=group_size,
                model="512 wide, 4,096-token vocabulary, 1 text + 1 vision layer",
                config=origin,
            )


def perf_rows(emit, quick: bool) -> None:
    """The rows ``python -m video_grpo.bench perf`` prints for the shared prompt."""
    if quick:
        train_rows(emit, "quick", 512, 8)
        generation_row(emit, "quick", 512, 8, new_tokens=16)
        return
    train_rows(emit, "3b", 2048, 8)
    full_depth_rows(emit, "3b", 2048, 8)
    generation_row(emit, "3b", 2048, 8)
    scaling_rows(emit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.bench.shared_prefix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        choices=["gpu", "sdpa"],
        help="gpu: the train and generation rows on one device; sdpa: which attention kernel a packed forward "
        "runs, and its peak memory, default choice vs the memory-efficient kernel",
    )
    parser.add_argument("--widths", choices=list(WIDTHS), default="3b")
    parser.add_argument("--visual_tokens", type=int, default=2048)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)

    if args.command == "sdpa":
        sdpa_kernel_rows(emit, args.widths, args.visual_tokens, args.G, args.device, args.dtype)
        return 0
    train_rows(emit, args.widths, args.visual_tokens, args.G, args.device, args.dtype)
    generation_row(emit, args.widths, args.visual_tokens, args.G, device=args.device, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
