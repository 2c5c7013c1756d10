"""Decoding generated files in several codecs and containers, and variable frame rate."""

from __future__ import annotations

import subprocess

import pytest

from video_grpo.data.video import SamplingConfig, frame_spacing, read_video, sampled_fps

CODECS = {
    "h264.mp4": ["-c:v", "libx264", "-pix_fmt", "yuv420p"],
    "vp9.webm": ["-c:v", "libvpx-vp9", "-b:v", "200k"],
    "mpeg4.avi": ["-c:v", "mpeg4", "-q:v", "5"],
    "h264.mkv": ["-c:v", "libx264", "-pix_fmt", "yuv420p"],
}


def ffmpeg(*args: str) -> None:
    import imageio_ffmpeg

    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error", *args], check=True)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_codecs_and_containers(tmp_path, name):
    path = tmp_path / name
    ffmpeg("-f", "lavfi", "-i", "testsrc=size=160x96:rate=12:duration=8", *CODECS[name], str(path))
    video = read_video(
        str(path),
        SamplingConfig(
            fps=1.0, min_frames=2, max_frames=32, min_pixels=784, max_pixels=160 * 112, max_tokens=10_000
        ),
    )
    t, c, h, w = video.frames.shape
    assert t == 8 and c == 3 and h % 28 == 0 and w % 28 == 0
    assert sampled_fps(video.metadata) == pytest.approx(1.0, rel=0.05)
    assert video.frames.float().std() > 10  # real picture content, not a blank decode


def test_variable_frame_rate_is_sampled_evenly_in_time(tmp_path):
    path = tmp_path / "vfr.mp4"
    # 20 frames at 10 fps (0-2 s), then one frame every 0.5 s up to ~22 s
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=96x64:rate=10:duration=6",
        "-vf",
        "setpts='if(lt(N,20),N*0.1,2+(N-20)*0.5)/TB'",
        "-fps_mode",
        "vfr",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        str(path),
    )
    import decord

    starts = decord.VideoReader(str(path)).get_frame_timestamp(list(range(60)))[:, 0]
    video = read_video(str(path), SamplingConfig(fps=1.0, min_frames=2, max_frames=64))
    times = [starts[i] for i in video.metadata["frames_indices"]]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert (
        max(gaps) < 2 * min(gaps) + 0.5
    )  # index-uniform sampling would put half the frames in the first 2 s
    assert sum(t < 2.0 for t in times) <= 3
    assert sampled_fps(video.metadata) == pytest.approx(len(times) / 21.6, rel=0.1)


def test_variable_frame_rate_duration_and_time_scale_come_from_timestamps(tmp_path):
    """6.0 s: 3 s at 5 fps, then 3 s at 30 fps (106 frames). frames / average fps would read 3.5 s and give 6
    frames whose second_per_grid_ts tells the model the video is 1.7x shorter than it is."""
    path = tmp_path / "5then30.mkv"  # Matroska reports 30 fps for it, as the issue saw
    ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=96x64:rate=30:duration=4",
        "-vf",
        "setpts='if(lt(N,15),N*0.2,3+(N-15)/30)/TB'",
        "-frames:v",
        "106",
        "-fps_mode",
        "vfr",
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        str(path),
    )
    import decord

    reader = decord.VideoReader(str(path))
    starts = reader.get_frame_timestamp(list(range(len(reader))))[:, 0]
    assert (
        len(reader) == 106 and len(reader) / reader.get_avg_fps() < 0.7 * 6.0
    )  # what a frames/fps reading sees
    video = read_video(str(path), SamplingConfig(fps=2.0, min_frames=2, max_frames=64))
    meta = video.metadata
    assert meta["duration"] == pytest.approx(6.0, abs=0.1)
    assert video.frames.shape[0] == 12  # 2 fps over 6 s
    times = [float(starts[i]) for i in meta["frames_indices"]]
    assert meta["timestamps"] == pytest.approx(times, abs=1e-5)  # the frames' real presentation times
    real_spacing = (times[-1] - times[0]) / (len(times) - 1)
    assert 2 * frame_spacing(meta) == pytest.approx(2 * real_spacing) == pytest.approx(1.0, abs=0.05)
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 0.61  # spread evenly in time
