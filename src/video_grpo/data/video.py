"""Reading and sampling video frames under a hard visual-token budget.

We decode with decord directly instead of through qwen-vl-utils' ``fetch_video``: its fallback reader
(``torchvision.io.read_video``) no longer exists in torchvision 0.29, so every decord failure surfaced as an
``AttributeError``. Here every failure is a :class:`VideoReadError` naming the file and the reason.

The sampler returns frames already resized to the model family's size multiple (28 pixels for Qwen2.5-VL, 32
for Qwen3-VL and Qwen3.5), plus the metadata the model's time comes from: the sampled frames' indices and real
presentation timestamps (:mod:`video_grpo.inputs.families` turns them into ``second_per_grid_ts`` or ``<t seconds>``
text). Without them the processor assumes 24 fps and collapses the model's sense of time.

Stored frames (``python -m video_grpo.preprocess``) are :mod:`video_grpo.data.frame_cache`'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torchvision.transforms.v2 import functional as tvf


class VideoReadError(RuntimeError):
    """A video could not be opened or decoded. The message names the file and the reason."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot read video {path!r}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class SamplingConfig:
    """How frames are taken from a video. Mirrors the video_* fields of GRPOScriptArguments, plus the model
    family's frame geometry (:meth:`from_args` takes it from a :class:`~video_grpo.inputs.families.ModelFamily`)."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 64
    min_pixels: int = 16 * 28 * 28
    max_pixels: int = 256 * 28 * 28
    max_tokens: int = 3584
    size_multiple: int = (
        28  # frame sides are multiples of this: patch x spatial merge (Qwen2.5-VL 28, Qwen3 32)
    )
    temporal_patch: int = 2  # frames per temporal patch: the frame count is a multiple of it

    @property
    def pixels_per_token(self) -> int:
        """H x W pixels of a frame pair that become one visual token."""
        return self.size_multiple**2

    @classmethod
    def from_args(cls, args, family) -> SamplingConfig:
        return cls(
            fps=args.video_fps,
            min_frames=args.video_min_frames,
            max_frames=args.video_max_frames,
            min_pixels=args.video_min_pixels,
            max_pixels=args.video_max_pixels,
            max_tokens=args.video_max_tokens,
            size_multiple=family.size_multiple,
            temporal_patch=family.temporal_patch,
        )


@dataclass
class SampledVideo:
    """Frames (T, C, H, W uint8) and the metadata the processor and the trainer need."""

    frames: torch.Tensor
    metadata: dict


def fit_frame_size(
    height: int, width: int, min_pixels: int, max_pixels: int, multiple: int = 28
) -> tuple[int, int]:
    """Resize (height, width) to multiples of ``multiple``, keeping the aspect ratio, with min <= H*W <= max.

    When rounding to multiples cannot satisfy both (min close to max), min wins; the caller's frame-count
    reduction then keeps the video within its token budget.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"invalid frame size {height}x{width}")
    h = max(multiple, round(height / multiple) * multiple)
    w = max(multiple, round(width / multiple) * multiple)
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(multiple, math.floor(height / scale / multiple) * multiple)
        w = max(multiple, math.floor(width / scale / multiple) * multiple)
    if h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / multiple) * multiple
        w = math.ceil(width * scale / multiple) * multiple
    return h, w


def plan_sampling(duration: float, height: int, width: int, cfg: SamplingConfig) -> tuple[int, int, int]:
    """Choose how many frames to take from a ``duration``-second video and their size, within ``cfg.max_tokens``.

    Order of concessions: first shrink each frame (down to ``min_pixels``), then take fewer frames. The frames
    are then spread over the whole video by :func:`sample_times`, so a long video is covered end to end.
    Returns ``(count, height, width)``; ``count`` is a multiple of the temporal patch (2 frames).
    """
    pair, per_token = cfg.temporal_patch, cfg.pixels_per_token
    n = round(duration * cfg.fps)
    n = min(max(n, cfg.min_frames), cfg.max_frames)
    n = max(pair, n - n % pair)
    tokens_per_frame_pair_budget = cfg.max_tokens / (n // pair)
    frame_max_pixels = min(cfg.max_pixels, int(tokens_per_frame_pair_budget) * per_token)
    frame_max_pixels = max(frame_max_pixels, cfg.min_pixels)
    h, w = fit_frame_size(height, width, cfg.min_pixels, frame_max_pixels, cfg.size_multiple)
    tokens_per_pair = h * w // per_token
    while n > pair and n // pair * tokens_per_pair > cfg.max_tokens:
        n -= pair
    return n, h, w


def sample_times(count: int, duration: float) -> list[float]:
    """The instants (seconds from the first frame) the ``count`` frames show: the starts of ``count`` equal
    slices of the video. Frame k is then at k x duration / count, which is exactly where the model's time
    axis puts it (frame k at k / sampled fps)."""
    return [k * duration / count for k in range(count)]


def frames_at(starts: Sequence[float], times: Sequence[float]) -> list[int]:
    """For each instant, the index of the frame on screen then: the last frame that starts at or before it.

    ``starts`` are the frames' presentation times in seconds, ascending. Works for constant and variable frame
    rates alike; a video with fewer frames than instants repeats frames."""
    import bisect

    last = len(starts) - 1
    return [min(last, max(0, bisect.bisect_right(starts, starts[0] + t + 1e-6) - 1)) for t in times]


def frame_spacing(metadata: dict) -> float:
    """Mean real spacing in seconds between consecutive sampled frames, from their presentation timestamps.

    This is what Qwen2.5-VL's ``second_per_grid_ts`` must be built from (times the temporal patch size); for a
    variable-frame-rate file it differs from ``1 / (frames / fps)``."""
    times = metadata["timestamps"]
    if len(times) > 1 and times[-1] > times[0]:
        return (times[-1] - times[0]) / (len(times) - 1)
    return metadata["duration"] / max(len(times), 1)  # one frame repeated: its share of the video


def sampled_fps(metadata: dict) -> float:
    """Frames per second actually fed to the model: 1 / :func:`frame_spacing`."""
    return 1.0 / frame_spacing(metadata)


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


def frame_timeline(reader, total: int, native_fps: float) -> tuple[list[float], float]:
    """Every frame's presentation time (seconds, from the first frame) and the video's duration.

    Taken from the frames' own timestamps, not from ``total / fps``: for a variable-frame-rate file (say 3 s at
    5 fps, then 3 s at 30 fps) the container's average fps makes ``total / fps`` far from the real length."""
    stamps = reader.get_frame_timestamp(list(range(total)))  # (total, 2): start and end of each frame
    starts = [float(s) - float(stamps[0, 0]) for s in stamps[:, 0]]
    if any(
        b < a for a, b in zip(starts, starts[1:], strict=False)
    ):  # timestamps unusable: fall back to the rate
        starts = [i / native_fps for i in range(total)]
        return starts, total / native_fps
    last_length = float(stamps[-1, 1] - stamps[-1, 0])
    if not last_length > 0:
        last_length = (starts[-1] - starts[0]) / (total - 1) if total > 1 else 1 / native_fps
    return starts, starts[-1] + last_length


def read_video(path: str, cfg: SamplingConfig) -> SampledVideo:
    """Decode the frames chosen by :func:`plan_sampling`. Raises :class:`VideoReadError` on any failure."""
    reader, total, native_fps = _open(path)
    try:
        first = reader[0].shape  # (H, W, C)
        starts, duration = frame_timeline(reader, total, native_fps)
        count, h, w = plan_sampling(duration, first[0], first[1], cfg)
        indices = frames_at(starts, sample_times(count, duration))
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
        "timestamps": [round(starts[i], 6) for i in indices],  # presentation time of each sampled frame
        "duration": duration,
        "height": h,
        "width": w,
    }
    return SampledVideo(frames=frames, metadata=metadata)
