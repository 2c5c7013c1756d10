"""The flash videos of the learning benchmark and the demo, decoded with the project's real reader: the lit frames
are where each kind's annotation says they are (``event``, ``whole``) or nowhere near it (``mislabelled``)."""

from __future__ import annotations

import random

import pytest

from video_grpo.data.video import SamplingConfig, read_video
from video_grpo.toys.synthetic import FlashTask, disjoint_span, make_flash_split, temporal_iou

TASK = FlashTask(size=28, clock=True)
SAMPLING = SamplingConfig(
    fps=4.0, min_frames=4, max_frames=64, min_pixels=784, max_pixels=784, max_tokens=256
)


def lit_times(path) -> list[float]:
    """Times of the sampled frames whose upper half is not the grey background."""
    video = read_video(str(path), SAMPLING)
    times = video.metadata["timestamps"]
    upper = video.frames[:, :, : video.frames.shape[2] // 2].float()
    spread = (upper.amax(dim=(1, 2, 3)) - upper.amin(dim=(1, 2, 3))).tolist()
    return [t for t, s in zip(times, spread, strict=True) if s > 60]


@pytest.mark.parametrize("kind", ["event", "whole", "mislabelled"])
def test_lit_frames_match_each_kind(tmp_path, kind):
    records = make_flash_split(tmp_path, kind, 3, seed=5, task=TASK, kind=kind)
    for record in records:
        start, end = record["solution"]
        lit = lit_times(tmp_path / record["video"])
        assert lit, record
        lit_span = (min(lit), max(lit))
        if kind == "whole":
            assert (start, end) == (0.0, TASK.duration)
            assert lit_span[0] < 0.3 and lit_span[1] > TASK.duration - 0.5, (lit_span, record)
        elif kind == "event":
            assert start - 0.3 <= lit_span[0] and lit_span[1] <= end + 0.3, (lit_span, record)
        else:  # the flash is elsewhere: the annotation misses every lit frame
            assert all(not start - 0.3 < t < end + 0.3 for t in lit), (lit, record)
            assert TASK.min_length - 0.15 <= end - start <= TASK.max_length + 0.15


def test_event_kind_keeps_the_benchmark_videos(tmp_path):
    """The default kind draws spans and colours as before, so the benchmark's and the demo's sets are unchanged."""
    rng = random.Random(10)
    expected = [TASK.span(rng) for _ in range(1)]
    record = make_flash_split(tmp_path, "train", 1, seed=10, task=TASK)[0]
    assert tuple(record["solution"]) == expected[0]


def test_disjoint_span_same_length_never_overlaps():
    rng = random.Random(0)
    for _ in range(500):
        start, end = TASK.span(rng)
        other = disjoint_span(rng, TASK, start, end)
        assert temporal_iou(other, (start, end)) == 0.0
        assert abs((other[1] - other[0]) - (end - start)) < 1e-6
        assert other[0] >= 0.0 and other[1] <= TASK.duration
    with pytest.raises(ValueError, match="shorter events"):
        disjoint_span(rng, FlashTask(min_length=9.0, max_length=10.0), 3.0, 13.0)
