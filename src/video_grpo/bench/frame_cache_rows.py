"""Perf rows of the frame cache on a 30-s clip: ``cache_bytes_per_sample``, ``sample_prep_cache_vs_decode`` and
``cache_fidelity``."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import torch

from video_grpo.bench.emit import emit


def sample_prep(work: Path, repeats: int, preset: str | None = None) -> None:
    """The three rows on one generated clip; ``preset``: x264's ``-preset`` for encoding it (None: its default,
    ``medium``). ``bench perf --quick`` encodes with ``superfast``, a third of the CPU (3 s vs 10 s here): the stream
    keeps CABAC, deblocking and B-frames, so decoding it costs the same, and its entries measured the same (bytes
    ratio 0.0861 vs 0.0862, PSNR 40.16 dB both)."""
    import imageio_ffmpeg
    from torchvision.io import decode_jpeg, encode_jpeg

    from video_grpo.data.dataset import VideoTransform
    from video_grpo.data.frame_cache import (
        JPEG_QUALITY,
        decode_frames,
        entry_tensors,
        psnr,
        read_cached,
        write_cache,
    )
    from video_grpo.data.video import SamplingConfig, read_video

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
            *(["-preset", preset] if preset else []),
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
    codec = f"h264 ({preset})" if preset else "h264"
    clip = f"30 s, 640x360, 30 fps {codec}; {frames} frames of {width}x{height} at 2 fps"
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
