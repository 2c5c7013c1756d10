"""Reading and sampling video frames under a hard visual-token budget.

We decode with decord directly instead of through qwen-vl-utils' ``fetch_video``: its fallback reader
(``torchvision.io.read_video``) no longer exists in torchvision 0.29, so every decord failure surfaced as an
``AttributeError``. Here every failure is a :class:`VideoReadError` naming the file and the reason.

The sampler returns frames already resized to multiples of 28 pixels, plus the metadata (native fps, frame
indices) that lets the Qwen2.5-VL processor compute ``second_per_grid_ts`` from the *sampled* fps. Without it
the processor assumes 24 fps and collapses the model's sense of time.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

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


def read_video(path: str, cfg: SamplingConfig) -> SampledVideo:
    """Decode the frames chosen by :func:`plan_sampling`. Raises :class:`VideoReadError` on any failure."""
    if not os.path.isfile(path):
        raise VideoReadError(path, "file does not exist")
    if os.path.getsize(path) == 0:
        raise VideoReadError(path, "file is empty")
    try:
        import decord

        reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
        total = len(reader)
        native_fps = float(reader.get_avg_fps())
        if total < 1 or not native_fps > 0:
            raise VideoReadError(path, f"no decodable frames (frames={total}, fps={native_fps})")
        first = reader[0].shape  # (H, W, C)
        indices, h, w = plan_sampling(total, native_fps, first[0], first[1], cfg)
        frames = torch.from_numpy(reader.get_batch(indices).asnumpy())
    except VideoReadError:
        raise
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


def sampled_fps(metadata: dict) -> float:
    """Frames per second actually fed to the model (what ``second_per_grid_ts`` must be based on)."""
    return len(metadata["frames_indices"]) / metadata["total_num_frames"] * metadata["fps"]
