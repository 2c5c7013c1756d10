"""Perf rows of encoding each video once: ``vision_rows_per_step``, ``step_time`` and (full run only)
``encoder_time_scaling``, each against the plain path that runs the vision tower once per row."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from video_grpo.bench.emit import emit
from video_grpo.bench.perf_trainer import build_trainer, sample_dataset


def vision_rows_per_step(model_dir: Path, work: Path) -> None:
    dataset = sample_dataset()
    for frozen in (False, True):
        rows = {}
        for once in (True, False):
            # shared_prefix off on both sides: packing also runs the tower once per prompt, which would hide
            # the plain path's per-row encoding that this row measures
            trainer = build_trainer(
                model_dir, work / f"rows-{frozen}-{once}", dataset, once, freeze=frozen, shared_prefix=False
            )
            counted: list[int] = []
            models = [trainer.model] + ([trainer.ref_model] if trainer.ref_model is not None else [])
            for model in models:
                model.model.visual.register_forward_hook(
                    lambda m, args, out, counted=counted: counted.append(args[0].shape[0])
                )
            trainer.train()
            rows[once] = sum(counted)
        goal = 1 / (3 * 8) if frozen else 1 / 8
        emit(
            "vision_rows_per_step",
            rows[True],
            rows[False],
            "rows",
            setting="frozen" if frozen else "trainable",
            G=8,
            beta=0.04,
            goal=f"ratio <= {goal * 1.05:.4f}",
        )


def step_time(work: Path, steps: int) -> None:
    from video_grpo.toys.tiny import build_tiny_model

    # Vision tower and language model of comparable cost, as for Qwen2.5-VL-7B at 2 fps, where the encoder
    # is roughly a quarter of a forward; the measured share is reported, not assumed.
    model_dir = build_tiny_model(
        work / "step-model", text_hidden=128, text_layers=4, vision_hidden=128, vision_depth=4
    )
    dataset = sample_dataset()
    timings = {}
    share = None
    for once in (True, False):
        trainer = build_trainer(
            model_dir, work / f"step-{once}", dataset, once, max_steps=steps, shared_prefix=False
        )
        encoder_seconds = [0.0]
        starts = {}

        def before(module, args, starts=starts):
            starts["t"] = time.perf_counter()

        def after(module, args, out, starts=starts, acc=encoder_seconds):
            acc[0] += time.perf_counter() - starts["t"]

        trainer.model.model.visual.register_forward_pre_hook(before)
        trainer.model.model.visual.register_forward_hook(after)
        started = time.perf_counter()
        trainer.train()
        timings[once] = (time.perf_counter() - started) / steps
        if not once:
            share = encoder_seconds[0] / (timings[once] * steps)
    emit(
        "step_time",
        timings[True],
        timings[False],
        "s/step",
        steps=steps,
        encoder_share_of_plain_step_forward_time=round(share, 3),
    )


def encoder_scaling(model_dir: Path) -> None:
    """How the encoder's cost grows with G, frames and frame size: one training forward's encoder time for
    one video shown to G rows, per row (plain) vs once (ours)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    visual = model.model.visual
    for frames, side in ((8, 112), (16, 112), (16, 224)):
        grid = torch.tensor([[frames // 2, side // 14, side // 14]])
        pixels = torch.randn(int(grid.prod()), 1176)
        for g in (2, 4, 8):
            timings = {}
            for name, copies in (("once", 1), ("plain", g)):
                started = time.perf_counter()
                for _ in range(3):
                    visual(
                        pixels.repeat(copies, 1), grid_thw=grid.repeat(copies, 1)
                    ).pooler_output.sum().backward()
                timings[name] = (time.perf_counter() - started) / 3
            emit(
                "encoder_time_scaling",
                timings["once"],
                timings["plain"],
                "s per forward+backward",
                G=g,
                frames=frames,
                frame_size=f"{side}x{side}",
                encoder_rows_plain=int(grid.prod()) * g,
            )
