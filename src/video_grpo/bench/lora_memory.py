"""Perf row ``peak_memory_lora_beta``: peak RSS of a LoRA run with a KL term (beta > 0) vs without, each side
in a fresh process (:func:`~video_grpo.bench.peak_memory.in_fresh_process`: a new interpreter; ``--quick`` forks
both from a server that has only imported the libraries, whose peaks then read ~300 MB lower on both sides); the
reference model is the base with the adapter off, not a copy.

What the row tells apart is the weights: a reference copy would add the model's ~430 MB (fp32) to the
beta > 0 side only. ``--quick`` feeds shorter prompts (2 frames of at most 112x112, about 4x fewer positions),
which shrinks the activations both sides share, not the weights, so a copy would stand out more, not less."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
from pathlib import Path

from video_grpo.bench.emit import emit
from video_grpo.bench.peak_memory import in_fresh_process
from video_grpo.bench.perf_trainer import build_trainer, sample_dataset


def peak_rss_side(setting: dict) -> dict:
    """One side's LoRA run in this process (a fresh one, :func:`peak_memory`), its peak resident set back."""
    from peft import LoraConfig

    from video_grpo.data.video import SamplingConfig

    sampling = None  # sample_dataset's default: up to 16 frames
    if setting["quick"]:
        sampling = SamplingConfig(
            fps=1.0, min_frames=2, max_frames=2, min_pixels=784, max_pixels=112 * 112, max_tokens=512
        )
    trainer = build_trainer(
        setting["model_dir"],
        setting["out_dir"],
        sample_dataset(sampling),
        beta=setting["beta"],
        per_device_train_batch_size=4,
        num_generations=4,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_completion_length=8,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    )
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train()
    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def peak_memory(work: Path, quick: bool = False) -> None:
    from video_grpo.toys.tiny import build_tiny_model

    model_dir = build_tiny_model(
        work / "lora-model", text_hidden=1024, text_layers=9, text_intermediate=2816, vision_hidden=128
    )
    params = json.loads((model_dir / "tiny_model_info.json").read_text())["parameters"]
    peaks = {}
    # two threads unless the caller set a count: the test suite's workers run one thread each on two cores, and
    # two OpenMP threads per side beside the other worker oversubscribe them (spinning threads burn CPU)
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    for beta in (0.04, 0.0):
        setting = {
            "model_dir": str(model_dir),
            "beta": beta,
            "out_dir": str(work / f"lora-{beta}"),
            "quick": quick,
        }
        peaks[beta] = in_fresh_process("video_grpo.bench.lora_memory", "peak_rss_side", setting, threads)[
            "peak_rss_mb"
        ]
    emit(
        "peak_memory_lora_beta",
        peaks[0.04],
        peaks[0.0],
        "MB peak RSS",
        parameters=params,
        frames=2 if quick else 16,
        ours_setting="LoRA, beta=0.04",
        baseline_setting="LoRA, beta=0",
        goal="ratio <= 1.15",
    )
