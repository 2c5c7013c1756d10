import shutil
import subprocess

import pytest
import torch

from video_grpo.data.video import (
    SamplingConfig,
    VideoReadError,
    frames_at,
    plan_sampling,
    read_video,
    sample_times,
    sampled_fps,
)

from .conftest import SAMPLES

VIDEO = SAMPLES / "videos" / "train_000.mp4"


def test_ten_minute_video_stays_under_cap_and_spans_whole_video():
    cfg = SamplingConfig(fps=2.0, max_frames=768, min_pixels=128 * 784, max_pixels=768 * 784, max_tokens=3584)
    total = 10 * 60 * 30  # 10 minutes at 30 fps
    count, h, w = plan_sampling(total / 30.0, 720, 1280, cfg)
    tokens = count // 2 * (h * w // 784)
    assert tokens <= cfg.max_tokens
    assert h % 28 == 0 and w % 28 == 0 and h * w >= cfg.min_pixels
    indices = frames_at([i / 30.0 for i in range(total)], sample_times(count, total / 30.0))
    assert indices[0] == 0 and indices[-1] >= total - total // count  # covers start to end
    gaps = torch.tensor(indices).diff()
    assert gaps.min() >= gaps.max() - 1  # uniform spread
    assert count % 2 == 0


@pytest.mark.parametrize("fps", [1.0, 2.0])
def test_read_video_metadata_gives_sampled_fps(fps):
    cfg = SamplingConfig(
        fps=fps, min_frames=2, max_frames=256, min_pixels=784, max_pixels=112 * 112, max_tokens=100000
    )
    video = read_video(str(VIDEO), cfg)
    t, c, h, w = video.frames.shape
    assert c == 3 and video.frames.dtype == torch.uint8 and (h, w) == (112, 112)
    assert t == len(video.metadata["frames_indices"]) and t % 2 == 0
    # 34 s video: sampled fps is the requested one, up to rounding to an even frame count
    assert sampled_fps(video.metadata) == pytest.approx(fps, rel=0.05)


def test_one_frame_video_is_repeated(tmp_path):
    import imageio_ffmpeg

    path = tmp_path / "one.mp4"
    subprocess.run(
        [
            imageio_ffmpeg.get_ffmpeg_exe(),
            "-loglevel",
            "error",
            "-f",
            "lavfi",
            "-i",
            "color=c=red:s=64x64:d=0.04",
            "-frames:v",
            "1",
            "-pix_fmt",
            "yuv420p",
            str(path),
        ],
        check=True,
    )
    video = read_video(str(path), SamplingConfig(min_frames=1))
    assert video.frames.shape[0] == 2  # one temporal patch
    assert torch.equal(video.frames[0], video.frames[1])


@pytest.mark.parametrize("kind", ["missing", "empty", "text", "truncated"])
def test_bad_files_raise_our_error_naming_the_file(tmp_path, kind):
    path = tmp_path / f"{kind}.mp4"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("this is not a video\n" * 100)
    elif kind == "truncated":
        shutil.copy(VIDEO, path)
        path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(VideoReadError) as info:
        read_video(str(path), SamplingConfig())
    assert str(path) in str(info.value)
