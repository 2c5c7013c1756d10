"""Synthetic grounding videos in which the queried event is visible.

Each video is a plain textured background on which a shape of a named colour appears at ``start``,
moves across the frame, and disappears at ``end``; the sentence names the colour and shape. Generation is
deterministic for a seed (the mp4 bytes depend on the ffmpeg build). Used for ``data_samples/``
(``scripts/make_samples.py``) and by ``python -m video_grpo.bench learning``.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from video_grpo.data.annotations import write_jsonl

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 210, 40),
}
SHAPES = ("square", "circle")


def ffmpeg_exe() -> str:
    """The ffmpeg binary shipped by imageio-ffmpeg, so no system ffmpeg is needed."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def draw_shape(
    frame: np.ndarray, shape: str, colour: tuple[int, int, int], cx: float, cy: float, r: int
) -> None:
    h, w, _ = frame.shape
    yy, xx = np.mgrid[0:h, 0:w]
    if shape == "circle":
        mask = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    else:
        mask = (np.abs(xx - cx) <= r) & (np.abs(yy - cy) <= r)
    frame[mask] = colour


def render_video(
    path: Path,
    duration: float,
    start: float,
    end: float,
    colour: str,
    shape: str,
    rng: random.Random,
    fps: int = 4,
    size: int = 112,
    codec_args: tuple[str, ...] = ("-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", "30"),
) -> None:
    """Encode one video by piping raw RGB frames into ffmpeg."""
    n_frames = int(round(duration * fps))
    base = np.full((size, size, 3), 90, dtype=np.uint8)
    # A fixed checker texture so frames are not trivially uniform.
    tile = (np.indices((size, size)).sum(axis=0) // 14) % 2
    base[tile == 1] = 110
    y0, y1 = rng.uniform(0.25, 0.75) * size, rng.uniform(0.25, 0.75) * size
    radius = size // 8
    cmd = [
        ffmpeg_exe(), "-y", "-loglevel", "error",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{size}x{size}", "-r", str(fps), "-i", "-",
        *codec_args, str(path),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    for i in range(n_frames):
        t = i / fps
        frame = base.copy()
        if start <= t < end:
            progress = (t - start) / max(end - start, 1e-6)
            cx = radius + progress * (size - 2 * radius)
            cy = y0 + progress * (y1 - y0)
            draw_shape(frame, shape, COLOURS[colour], cx, cy, radius)
        proc.stdin.write(frame.tobytes())
    proc.stdin.close()
    if proc.wait() != 0:
        raise RuntimeError(f"ffmpeg failed while writing {path}")


def make_split(out: Path, split: str, count: int, seed: int, min_dur: float, max_dur: float) -> list[dict]:
    rng = random.Random(seed)
    video_dir = out / "videos"
    video_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(count):
        vid = f"{split}_{i:03d}"
        duration = float(rng.randint(int(min_dur), int(max_dur)))
        length = rng.uniform(0.2, 0.5) * duration
        start = round(rng.uniform(0, duration - length), 1)
        end = round(start + length, 1)
        colour = rng.choice(sorted(COLOURS))
        shape = rng.choice(SHAPES)
        render_video(video_dir / f"{vid}.mp4", duration, start, end, colour, shape, rng)
        records.append(
            {
                "id": vid,
                "video": f"videos/{vid}.mp4",
                "duration": duration,
                "solution": [start, end],
                "sentence": f"a {colour} {shape} moves across the screen",
            }
        )
    write_jsonl(out / f"{split}.jsonl", records)
    return records


# -- the learnable task: ``python -m video_grpo.bench learning`` and ``make demo`` ------------------------------


@dataclass(frozen=True)
class FlashTask:
    """Videos of one fixed length in which the whole screen turns a named colour between S and E.

    Why this shape: the event is impossible to miss (every visual token changes), the video length is fixed so
    seconds map to the same temporal positions in every video, and events are short and placed anywhere, so
    no single fixed span scores well (see :func:`best_fixed_span`). Spans are continuous (0.1 s steps); the
    videos are rendered at ``render_fps``, finer than any sampling the model sees.
    """

    duration: float = 16.0
    min_length: float = 2.0
    max_length: float = 4.0
    render_fps: int = 8
    size: int = 56
    slots: int | None = None  # coarse variant: each event fills one of ``slots`` equal slots exactly
    clock: bool = False  # the lower half of every frame shows the time as a grey level (see render_flash)

    def __post_init__(self) -> None:
        if not 0 < self.min_length <= self.max_length < self.duration:
            raise ValueError(
                f"FlashTask: need 0 < min_length <= max_length < duration, got min_length="
                f"{self.min_length}, max_length={self.max_length}, duration={self.duration}"
            )

    def span(self, rng: random.Random) -> tuple[float, float]:
        if self.slots:
            width = self.duration / self.slots
            slot = rng.randrange(self.slots)
            return round(slot * width, 1), round((slot + 1) * width, 1)
        length = rng.uniform(self.min_length, self.max_length)
        start = round(rng.uniform(0, self.duration - length), 1)
        return start, round(min(self.duration, start + length), 1)


def render_flash(path: Path, task: FlashTask, start: float, end: float, colour: str) -> None:
    """A steady grey, lightly textured screen that is filled with ``colour`` while ``start <= t < end``.

    With ``task.clock`` only the upper half flashes and the lower half shows a grey level that rises with t: a
    clock drawn in the frame. Why: the tiny model's visual tokens carry no time of their own (Qwen2.5-VL puts time
    in the rotary positions only), and reading seconds off positions was more than it learned on 2 cores."""
    size = task.size
    base = np.full((size, size, 3), 70, dtype=np.uint8)
    base[(np.indices((size, size)).sum(axis=0) // 7) % 2 == 1] = (
        80  # a fixed texture, the same in every frame
    )
    lit = np.empty_like(base)
    lit[:] = COLOURS[colour]
    half = size // 2 if task.clock else size
    cmd = [
        ffmpeg_exe(), "-y", "-loglevel", "error",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{size}x{size}", "-r", str(task.render_fps), "-i", "-",
        "-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", "20", "-g", str(task.render_fps), str(path),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    for i in range(int(round(task.duration * task.render_fps))):
        t = i / task.render_fps
        frame = (lit if start <= t < end else base).copy()
        frame[half:] = int(20 + 215 * t / task.duration)
        proc.stdin.write(frame.tobytes())
    proc.stdin.close()
    if proc.wait() != 0:
        raise RuntimeError(f"ffmpeg failed while writing {path}")


FLASH_KINDS = ("event", "whole", "mislabelled")


def make_flash_split(
    out: Path, split: str, count: int, seed: int, task: FlashTask = FlashTask(), kind: str = "event"
) -> list[dict]:
    """Write ``count`` videos and ``<out>/<split>.jsonl``; the same seed gives the same spans and colours.

    ``kind`` sets how hard a query is, for curation (``video_grpo.bench.curation``):

    - ``event``: the task's event, annotated where it happens;
    - ``whole``: the screen is lit from the first frame to the last, annotated ``[0, duration]``: a query a model
      that has seen such videos answers exactly every time (all rewards in its group equal, near 1);
    - ``mislabelled``: the task's event, annotated with a span of the same length that does not overlap it, as a
      wrong annotation in a real dataset: a model that looks is never rewarded (all rewards in its group 0).
    """
    if kind not in FLASH_KINDS:
        raise ValueError(f"make_flash_split: kind must be one of {FLASH_KINDS}, got {kind!r}")
    rng = random.Random(seed)
    video_dir = out / "videos"
    video_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(count):
        vid = f"{split}_{i:03d}"
        start, end = (0.0, task.duration) if kind == "whole" else task.span(rng)
        colour = rng.choice(sorted(COLOURS))
        render_flash(video_dir / f"{vid}.mp4", task, start, end, colour)
        solution = [start, end] if kind != "mislabelled" else list(disjoint_span(rng, task, start, end))
        records.append(
            {
                "id": vid,
                "video": f"videos/{vid}.mp4",
                "duration": task.duration,
                "solution": solution,
                "sentence": f"the screen turns {colour}",
            }
        )
    write_jsonl(out / f"{split}.jsonl", records)
    return records


def disjoint_span(rng: random.Random, task: FlashTask, start: float, end: float) -> tuple[float, float]:
    """A span as long as ``[start, end]`` that does not overlap it (0.1-s steps), before or after it."""
    length = round(end - start, 1)
    before = [round(k / 10, 1) for k in range(int(round((start - length) * 10)) + 1)]
    after = [
        round(k / 10, 1) for k in range(int(round(end * 10)), int(round((task.duration - length) * 10)) + 1)
    ]
    if not before + after:
        raise ValueError(
            f"disjoint_span: no {length}-s span in {task.duration} s avoids [{start}, {end}]; use shorter events"
        )
    first = rng.choice(before + after)
    return first, round(first + length, 1)


def temporal_iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def best_fixed_span(
    train: list[dict], step: float = 0.5, threshold: float | None = None
) -> tuple[float, float]:
    """The one span, on a ``step``-second grid over the longest video, with the highest mean IoU on ``train``
    (with ``threshold``: the most IoUs >= ``threshold``, i.e. R1@threshold): what a policy that ignores the video
    can at best answer. Ties go to the first span on the grid."""
    horizon = max(float(r["duration"]) for r in train)
    grid = [k * step for k in range(int(horizon / step) + 1)]
    spans = [(a, b) for i, a in enumerate(grid) for b in grid[i + 1 :]]
    truths = [tuple(r["solution"]) for r in train]
    if threshold is None:
        return max(spans, key=lambda s: sum(temporal_iou(s, t) for t in truths))
    return max(spans, key=lambda s: sum(temporal_iou(s, t) >= threshold for t in truths))
