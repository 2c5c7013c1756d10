"""Benchmarks. Each prints one JSON line per measurement, both sides measured in the same run:
``{"name", "ours", "baseline", "ratio", "unit", ...}``.

    python -m video_grpo.bench perf [--quick]

- ``vision_rows_per_step``: encoder input rows in one training step (G = 8, beta = 0.04), encoding each
  video once vs the plain per-row path; trainable and frozen vision tower.
- ``step_time``: seconds per training step, same comparison, on a small model whose vision tower is a
  sizeable share of the forward (the share is printed as ``encoder_share``).
- ``cache_bytes_per_sample``: bytes of one frame-cache entry in the jpeg format vs raw (with the GB that
  1,000 such videos take in each).
- ``sample_prep_cache_vs_decode``: milliseconds to prepare one sample from the frame cache vs decoding it; one
  row per cache format (``format``).
- ``cache_fidelity``: PSNR of the jpeg entry's frames against the decoded ones, at the default quality (and,
  in ``by_quality``, at 80/90/95), vs torchvision's own ``encode_jpeg`` (colour at half resolution).
- ``data_wait_fraction``: share of training time spent waiting for the next batch, with
  ``dataloader_num_workers=2`` vs 0.
- ``peak_memory_lora_beta``: peak RSS of a LoRA run with beta = 0.04 vs beta = 0 on a ~108M-parameter
  model (the reference is the base with the adapter off, not a copy).
- ``lm_positions_per_forward``, ``train_step_time_shared_prefix``, ``peak_memory_shared_prefix``,
  ``generation_time_shared_prefill``, and (full run only) ``shared_prefix_scaling``: one group's prompt through
  the language model once vs G times; see :mod:`video_grpo.bench.shared_prefix`.
- ``encoder_time_scaling`` (full run only): vision-encoder forward+backward time for one video shown to G
  rows, once vs per row, over G, frame count and frame size.

Timings on a shared 2-core machine are noisy; ratios of two sides measured back to back are the
meaningful numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
emit_stream = None  # where JSON lines go; stdout, even while trainer output is redirected
SAMPLES = REPO / "data_samples"


def emit(name: str, ours: float, baseline: float, unit: str, **extra) -> dict:
    line = {
        "name": name,
        "ours": round(ours, 6),
        "baseline": round(baseline, 6),
        "ratio": round(ours / baseline, 6) if baseline else None,
        "unit": unit,
        **extra,
    }
    print(json.dumps(line), file=emit_stream or sys.stdout, flush=True)
    return line


def length_reward(completions, **kwargs) -> list[float]:
    """Differs within a group, so every benchmarked step has nonzero advantages and real gradients."""
    return [float(len(str(c)) % 7) for c in completions]


def _trainer(
    model_dir,
    out_dir,
    dataset,
    encode_once: bool = True,
    freeze: bool = False,
    peft_config=None,
    shared_prefix: bool | None = None,
    **overrides,
):
    from transformers import AutoProcessor
    from trl import GRPOConfig

    from video_grpo.rewards import format_soft_reward, iou_reward
    from video_grpo.trainer import VideoGRPOTrainer

    settings = {
        "output_dir": str(out_dir),
        "per_device_train_batch_size": 8,
        "num_generations": 8,
        "steps_per_generation": 2,
        "gradient_accumulation_steps": 2,
        "max_completion_length": 16,
        "max_steps": 1,
        "learning_rate": 1e-4,
        "bf16": False,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "beta": 0.04,
        "loss_type": "grpo",
        "seed": 0,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    settings.update(overrides)
    return VideoGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[iou_reward, format_soft_reward, length_reward],
        args=GRPOConfig(**settings),
        train_dataset=dataset,
        processing_class=AutoProcessor.from_pretrained(model_dir),
        peft_config=peft_config,
        encode_video_once=encode_once,
        freeze_vision_tower=freeze,
        shared_prefix=shared_prefix,
    )


def _dataset(sampling=None):
    from video_grpo.data import build_dataset
    from video_grpo.video import SamplingConfig

    sampling = sampling or SamplingConfig(
        fps=1.0, min_frames=4, max_frames=16, min_pixels=784, max_pixels=112 * 112, max_tokens=512
    )
    return build_dataset(SAMPLES / "train.jsonl", sampling=sampling)


def vision_rows_per_step(model_dir: Path, work: Path) -> None:
    dataset = _dataset()
    for frozen in (False, True):
        rows = {}
        for once in (True, False):
            # shared_prefix off on both sides: packing also runs the tower once per prompt, which would hide
            # the plain path's per-row encoding that this row measures
            trainer = _trainer(
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
    dataset = _dataset()
    timings = {}
    share = None
    for once in (True, False):
        trainer = _trainer(
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


def sample_prep(work: Path, repeats: int) -> None:
    import imageio_ffmpeg
    from torchvision.io import decode_jpeg, encode_jpeg

    from video_grpo.data import VideoTransform
    from video_grpo.frame_cache import (
        JPEG_QUALITY,
        decode_frames,
        entry_tensors,
        psnr,
        read_cached,
        write_cache,
    )
    from video_grpo.video import SamplingConfig, read_video

    video = work / "clip.mp4"  # 30 s of 640x360 at 30 fps: a typical Charades-like clip
    subprocess.run(
        [
            imageio_ffmpeg.get_ffmpeg_exe(),
            "-y",
            "-loglevel",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=640x360:rate=30:duration=30",
            "-c:v",
            "libx264",
            "-pix_fmt",
            "yuv420p",
            str(video),
        ],
        check=True,
    )
    sampling = SamplingConfig(fps=2.0, max_frames=64, min_pixels=784, max_pixels=448 * 252, max_tokens=3584)
    cache = work / "cache"
    decoded = read_video(str(video), sampling)
    formats = ("raw", "jpeg")
    sizes = {fmt: write_cache(cache, str(video), sampling, decoded, fmt).stat().st_size for fmt in formats}
    frames, height, width = decoded.frames.shape[0], decoded.metadata["height"], decoded.metadata["width"]
    clip = f"30 s, 640x360, 30 fps h264; {frames} frames of {width}x{height} at 2 fps"
    emit(
        "cache_bytes_per_sample",
        sizes["jpeg"],
        sizes["raw"],
        "bytes/sample",
        format="jpeg",
        quality=JPEG_QUALITY,
        ours_setting="jpeg entry",
        baseline_setting=f"raw entry ({clip})",
        gb_per_1000_videos={fmt: round(sizes[fmt] * 1000 / 1e9, 2) for fmt in formats},
        goal="ratio <= 0.125",
    )

    row = {"video": [str(video)], "sentence": ["x"], "duration": [30.0]}
    transforms = {
        "decode": VideoTransform(sampling),
        **{fmt: VideoTransform(sampling, cache_dir=str(cache), cache_format=fmt) for fmt in formats},
    }
    timings = {}
    for name, transform in transforms.items():
        transform(row)  # warm up
        started = time.perf_counter()
        for _ in range(repeats):
            transform(row)
        timings[name] = (time.perf_counter() - started) / repeats * 1000
    for fmt in formats:
        emit(
            "sample_prep_cache_vs_decode",
            timings[fmt],
            timings["decode"],
            "ms/sample",
            format=fmt,
            ours_setting=f"frame cache, {fmt}",
            baseline_setting=f"decode ({clip})",
            speedup=round(timings["decode"] / timings[fmt], 1),
            goal="speedup >= 20" if fmt == "raw" else "speedup >= 10",
        )

    # Fidelity: what the jpeg entry gives back against the decoded frames, at each quality; the baseline is
    # torchvision's encode_jpeg at the same quality, which always halves the colour resolution (4:2:0).
    by_quality = []
    for quality in (80, 90, 95):
        tensors, _ = entry_tensors(decoded, "jpeg", quality)
        started = time.perf_counter()
        restored = decode_frames(tensors["jpeg"], tensors["offsets"])
        decode_ms = (time.perf_counter() - started) * 1000
        by_quality.append(
            {
                "quality": quality,
                "psnr_db": round(psnr(restored, decoded.frames), 2),
                "bytes_ratio_vs_raw": round(tensors["jpeg"].numel() / decoded.frames.numel(), 4),
                "decode_ms": round(decode_ms, 1),
            }
        )
    cached = read_cached(cache, str(video), sampling, "jpeg").frames
    subsampled = torch.stack(decode_jpeg(encode_jpeg(list(decoded.frames), quality=JPEG_QUALITY)))
    emit(
        "cache_fidelity",
        psnr(cached, decoded.frames),
        psnr(subsampled, decoded.frames),
        "dB PSNR",
        format="jpeg",
        quality=JPEG_QUALITY,
        ours_setting=f"jpeg entry, 4:4:4, quality {JPEG_QUALITY}",
        baseline_setting=f"torchvision encode_jpeg, 4:2:0, quality {JPEG_QUALITY}",
        by_quality=by_quality,
        goal="ours >= 38",
    )


def data_wait(model_dir: Path, work: Path, steps: int) -> None:
    dataset = _dataset()
    fractions = {}
    for workers in (2, 0):
        trainer = _trainer(
            model_dir,
            work / f"wait-{workers}",
            dataset,
            True,
            max_steps=steps,
            dataloader_num_workers=workers,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
        )
        waits: list[tuple[float, float]] = []  # (when the wait ended, how long it was)
        original = trainer.get_batch_samples

        def timed(*args, original=original, waits=waits, **kwargs):
            started = time.perf_counter()
            result = original(*args, **kwargs)
            waits.append((time.perf_counter(), time.perf_counter() - started))
            return result

        trainer.get_batch_samples = timed
        trainer.train()
        ended = time.perf_counter()
        # Steady state: from the end of the first batch's wait (worker start-up, a one-off) to the end.
        steady = waits[1:]
        fractions[workers] = sum(w for _, w in steady) / (ended - waits[0][0])
    emit(
        "data_wait_fraction",
        fractions[2],
        fractions[0],
        "fraction of train time after the first batch",
        steps=steps,
        ours_setting="dataloader_num_workers=2",
        baseline_setting="dataloader_num_workers=0",
        goal="ours <= 0.05",
    )


def _peak_rss_child(model_dir: str, beta: float, out_dir: str) -> None:
    from peft import LoraConfig

    trainer = _trainer(
        model_dir,
        out_dir,
        _dataset(),
        beta=beta,
        per_device_train_batch_size=4,
        num_generations=4,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_completion_length=8,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    )
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train()
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def peak_memory(work: Path) -> None:
    from video_grpo.toys.tiny import build_tiny_model

    model_dir = build_tiny_model(
        work / "lora-model", text_hidden=1024, text_layers=9, text_intermediate=2816, vision_hidden=128
    )
    params = json.loads((model_dir / "tiny_model_info.json").read_text())["parameters"]
    peaks = {}
    for beta in (0.04, 0.0):
        code = (
            "import sys; from video_grpo.bench.perf import _peak_rss_child; "
            f"_peak_rss_child({str(model_dir)!r}, {beta}, {str(work / f'lora-{beta}')!r})"
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "2"},
        )
        peaks[beta] = json.loads(result.stdout.strip().splitlines()[-1])["peak_rss_mb"]
    emit(
        "peak_memory_lora_beta",
        peaks[0.04],
        peaks[0.0],
        "MB peak RSS",
        parameters=params,
        ours_setting="LoRA, beta=0.04",
        baseline_setting="LoRA, beta=0",
        goal="ratio <= 1.15",
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


def perf(quick: bool) -> None:
    from transformers.utils import logging as hf_logging

    from video_grpo.toys.tiny import build_tiny_model

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build_tiny_model(work / "tiny")
        vision_rows_per_step(model_dir, work)
        step_time(work, steps=2 if quick else 6)
        sample_prep(work, repeats=3 if quick else 10)
        data_wait(model_dir, work, steps=8 if quick else 24)
        peak_memory(work)
        if not quick:
            encoder_scaling(model_dir)
        from video_grpo.bench.shared_prefix import perf_rows

        perf_rows(emit, quick)  # the shared prompt: lm_positions_per_forward ... shared_prefix_scaling


class _TrainerLogsToStderr(contextlib.redirect_stdout):
    """Trainer prints its log dicts on stdout; the benchmark's stdout is JSON lines only."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    perf_parser = sub.add_parser("perf", help="performance measurements")
    perf_parser.add_argument("--quick", action="store_true", help="fewer repeats; under 3 minutes on 2 cores")
    learning_parser = sub.add_parser(
        "learning", help="SFT then GRPO on a synthetic task: does it learn to look?"
    )
    learning_parser.add_argument("--plot", type=Path, help="write the curves + test-mIoU bars PNG here")
    learning_parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer test queries and GRPO steps, no guidance/curation runs (about 5 minutes); "
        "a smoke run: 40 steps are too few to show the gain",
    )
    args = parser.parse_args(argv)
    global emit_stream
    if args.command == "perf":
        emit_stream = sys.stdout
        with _TrainerLogsToStderr():
            perf(args.quick)
    elif args.command == "learning":
        emit_stream = sys.stdout
        with _TrainerLogsToStderr(), tempfile.TemporaryDirectory() as tmp:
            from transformers.utils import logging as hf_logging

            from video_grpo.bench.learning import run

            hf_logging.set_verbosity_error()
            torch.manual_seed(0)
            run(Path(tmp), emit, args.plot, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
