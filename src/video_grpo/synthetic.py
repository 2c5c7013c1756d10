"""Synthetic grounding videos in which the queried event is visible.

Each video is a plain textured background on which a shape of a named colour appears at ``start``,
moves across the frame, and disappears at ``end``; the sentence names the colour and shape. Generation is
deterministic for a seed (the mp4 bytes depend on the ffmpeg build). Used for ``data_samples/``
(``scripts/make_samples.py``) and by ``python -m video_grpo.bench learning``.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import numpy as np

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


def draw_shape(frame: np.ndarray, shape: str, colour: tuple[int, int, int], cx: float, cy: float, r: int) -> None:
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
    with open(out / f"{split}.jsonl", "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return records
