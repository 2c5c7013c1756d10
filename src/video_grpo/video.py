"""Reading and sampling video frames under a hard visual-token budget.

We decode with decord directly instead of through qwen-vl-utils' ``fetch_video``: its fallback reader
(``torchvision.io.read_video``) no longer exists in torchvision 0.29, so every decord failure surfaced as an
``AttributeError``. Here every failure is a :class:`VideoReadError` naming the file and the reason.

The sampler returns frames already resized to multiples of 28 pixels, plus the metadata (native fps, frame
indices) that lets the Qwen2.5-VL processor compute ``second_per_grid_ts`` from the *sampled* fps. Without it
the processor assumes 24 fps and collapses the model's sense of time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torchvision.transforms.v2 import functional as tvf

from video_grpo.configs import PIXELS_PER_TOKEN, TEMPORAL_PATCH

SIDE_FACTOR = 28  # frame sides must be multiples of patch (14) x spatial merge (2)


class VideoReadError(RuntimeError):
    """A video could not be opened or decoded. The message names the file and the reason."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot read video {path!r}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class SamplingConfig:
    """How frames are taken from a video. Mirrors the video_* fields of GRPOScriptArguments."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 64
    min_pixels: int = 16 * PIXELS_PER_TOKEN
    max_pixels: int = 256 * PIXELS_PER_TOKEN
    max_tokens: int = 3584

    @classmethod
    def from_args(cls, args) -> SamplingConfig:
        return cls(
            fps=args.video_fps,
            min_frames=args.video_min_frames,
            max_frames=args.video_max_frames,
            min_pixels=args.video_min_pixels,
            max_pixels=args.video_max_pixels,
            max_tokens=args.video_max_tokens,
        )


@dataclass
class SampledVideo:
    """Frames (T, C, H, W uint8) and the metadata the processor and the trainer need."""

    frames: torch.Tensor
    metadata: dict

    @property
    def num_tokens(self) -> int:
        t, _, h, w = self.frames.shape
        return t // TEMPORAL_PATCH * (h * w // PIXELS_PER_TOKEN)


def fit_frame_size(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Resize (height, width) to multiples of 28, keeping the aspect ratio, with min <= H*W <= max.

    When rounding to multiples of 28 cannot satisfy both (min close to max), min wins; the caller's frame-count
    reduction then keeps the video within its token budget.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"invalid frame size {height}x{width}")
    h = max(SIDE_FACTOR, round(height / SIDE_FACTOR) * SIDE_FACTOR)
    w = max(SIDE_FACTOR, round(width / SIDE_FACTOR) * SIDE_FACTOR)
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(SIDE_FACTOR, math.floor(height / scale / SIDE_FACTOR) * SIDE_FACTOR)
        w = max(SIDE_FACTOR, math.floor(width / scale / SIDE_FACTOR) * SIDE_FACTOR)
    if h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / SIDE_FACTOR) * SIDE_FACTOR
        w = math.ceil(width * scale / SIDE_FACTOR) * SIDE_FACTOR
    return h, w


def plan_sampling(
    total_frames: int, native_fps: float, height: int, width: int, cfg: SamplingConfig
) -> tuple[list[int], int, int]:
    """Choose frame indices and the output frame size so the video fits ``cfg.max_tokens``.

    Order of concessions: first shrink each frame (down to ``min_pixels``), then take fewer frames. Frames are
    always spread uniformly over the whole video, so a long video is covered end to end.
    """
    duration = total_frames / native_fps
    n = round(duration * cfg.fps)
    n = min(max(n, cfg.min_frames), cfg.max_frames)
    n = max(TEMPORAL_PATCH, n - n % TEMPORAL_PATCH)
    tokens_per_frame_pair_budget = cfg.max_tokens / (n // TEMPORAL_PATCH)
    frame_max_pixels = min(cfg.max_pixels, int(tokens_per_frame_pair_budget) * PIXELS_PER_TOKEN)
    frame_max_pixels = max(frame_max_pixels, cfg.min_pixels)
    h, w = fit_frame_size(height, width, cfg.min_pixels, frame_max_pixels)
    tokens_per_pair = h * w // PIXELS_PER_TOKEN
    while n > TEMPORAL_PATCH and n // TEMPORAL_PATCH * tokens_per_pair > cfg.max_tokens:
        n -= TEMPORAL_PATCH
    if total_frames >= n:
        indices = torch.linspace(0, total_frames - 1, n).round().long().tolist()
    else:  # short video: repeat frames (a 1-frame video becomes 2 identical frames)
        indices = [min(total_frames - 1, i * total_frames // n) for i in range(n)]
    return indices, h, w


def _open(path: str):
    """A decord reader with at least one frame and a positive fps, or :class:`VideoReadError`."""
    if not os.path.isfile(path):
        raise VideoReadError(path, "file does not exist")
    if os.path.getsize(path) == 0:
        raise VideoReadError(path, "file is empty")
    try:
        import decord

        reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
        total, native_fps = len(reader), float(reader.get_avg_fps())
    except Exception as err:  # decord raises DECORDError, RuntimeError ... on bad input
        raise VideoReadError(path, f"{type(err).__name__}: {err}".strip()) from err
    if total < 1 or not native_fps > 0:
        raise VideoReadError(path, f"no decodable frames (frames={total}, fps={native_fps})")
    return reader, total, native_fps


def probe_video(path: str) -> dict:
    """Open the container and read the header only: frame count, fps, size."""
    reader, total, native_fps = _open(path)
    try:
        height, width, _ = reader[0].shape
    except Exception as err:
        raise VideoReadError(path, f"first frame undecodable: {type(err).__name__}: {err}") from err
    return {"total_num_frames": total, "fps": native_fps, "height": height, "width": width}


def _spread_in_time(reader, total: int, count: int) -> list[int] | None:
    """For variable-frame-rate video: the frames nearest to ``count`` instants evenly spaced in *time*.

    Index-uniform sampling would bunch frames where the rate is high and misplace every frame in time.
    Returns None for constant-rate video, where index-uniform sampling is already time-uniform.
    """
    import numpy as np

    starts = reader.get_frame_timestamp(list(range(total)))[:, 0]
    gaps = np.diff(starts)
    if gaps.size == 0 or gaps.max() - gaps.min() <= 0.25 * max(float(np.median(gaps)), 1e-6):
        return None
    targets = np.linspace(starts[0], starts[-1], count)
    right = np.clip(np.searchsorted(starts, targets), 1, total - 1)
    nearest = np.where(targets - starts[right - 1] <= starts[right] - targets, right - 1, right)
    return nearest.astype(int).tolist()


def read_video(path: str, cfg: SamplingConfig) -> SampledVideo:
    """Decode the frames chosen by :func:`plan_sampling`. Raises :class:`VideoReadError` on any failure."""
    reader, total, native_fps = _open(path)
    try:
        first = reader[0].shape  # (H, W, C)
        indices, h, w = plan_sampling(total, native_fps, first[0], first[1], cfg)
        if total > len(indices):
            indices = _spread_in_time(reader, total, len(indices)) or indices
        frames = torch.from_numpy(reader.get_batch(indices).asnumpy())
    except Exception as err:  # decord raises DECORDError, RuntimeError, IndexError ... on bad input
        raise VideoReadError(path, f"{type(err).__name__}: {err}".strip()) from err
    frames = frames.permute(0, 3, 1, 2).contiguous()  # (T, C, H, W)
    if frames.shape[-2:] != (h, w):
        frames = tvf.resize(frames, [h, w], interpolation=tvf.InterpolationMode.BICUBIC, antialias=True)
    metadata = {
        "fps": native_fps,
        "total_num_frames": total,
        "frames_indices": indices,
        "duration": total / native_fps,
        "height": h,
        "width": w,
    }
    return SampledVideo(frames=frames, metadata=metadata)


CACHE_FORMAT_VERSION = 1


def cache_key(path: str, cfg: SamplingConfig) -> str:
    """Changes whenever the file (path, size, mtime) or any sampling setting changes."""
    stat = os.stat(path)
    identity = {"path": os.path.abspath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                "sampling": asdict(cfg), "version": CACHE_FORMAT_VERSION}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def cache_path(cache_dir: str | Path, path: str, cfg: SamplingConfig) -> Path:
    key = cache_key(path, cfg)
    return Path(cache_dir) / key[:2] / f"{key}.safetensors"


def write_cache(cache_dir: str | Path, path: str, cfg: SamplingConfig, video: SampledVideo) -> Path:
    """Store sampled frames atomically: a killed writer leaves a temp file, never a half entry."""
    from safetensors.torch import save_file

    target = cache_path(cache_dir, path, cfg)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".safetensors")
    os.close(fd)
    try:
        save_file({"frames": video.frames.contiguous()}, tmp, metadata={"video_metadata": json.dumps(video.metadata)})
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def read_cached(cache_dir: str | Path, path: str, cfg: SamplingConfig) -> SampledVideo | None:
    """The cached sample for this file and sampling, or None."""
    from safetensors import safe_open

    try:
        target = cache_path(cache_dir, path, cfg)
    except OSError:
        return None  # the video itself is gone; decoding will report it
    if not target.is_file():
        return None
    with safe_open(str(target), framework="pt") as f:
        return SampledVideo(frames=f.get_tensor("frames"), metadata=json.loads(f.metadata()["video_metadata"]))


def load_video(path: str, cfg: SamplingConfig, cache_dir: str | Path | None = None) -> SampledVideo:
    """Frames from the cache when present, else decoded."""
    if cache_dir:
        cached = read_cached(cache_dir, path, cfg)
        if cached is not None:
            return cached
    return read_video(path, cfg)


def sampled_fps(metadata: dict) -> float:
    """Frames per second actually fed to the model (what ``second_per_grid_ts`` must be based on)."""
    return len(metadata["frames_indices"]) / metadata["total_num_frames"] * metadata["fps"]
