"""The frame cache: keys, both formats and old entries, atomic writes (including a real SIGKILL), training from
the cache, and the preprocess CLI (size estimate, dry run)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import save_file

from video_grpo.data import frame_cache
from video_grpo.data.dataset import build_dataset
from video_grpo.data.frame_cache import cache_key, cache_path, psnr, read_cached, read_entry, write_cache
from video_grpo.data.video import SamplingConfig, read_video
from video_grpo.preprocess import main as preprocess_main
from video_grpo.preprocess import preprocess

from .conftest import REPO, SAMPLES
from .test_trainer import ForwardProbe, make_trainer

SAMPLING = SamplingConfig(
    fps=1.0, min_frames=2, max_frames=8, min_pixels=784, max_pixels=56 * 56, max_tokens=64
)
VIDEO = str(SAMPLES / "videos" / "train_003.mp4")
MIN_JPEG_PSNR = 38.0  # the fidelity docs/data.md states for the jpeg format


def test_key_covers_file_and_every_sampling_setting(tmp_path):
    copy = tmp_path / "v.mp4"
    shutil.copy(VIDEO, copy)
    base = cache_key(str(copy), SAMPLING)
    for change in (
        {"fps": 2.0},
        {"max_frames": 16},
        {"min_pixels": 2 * 784},
        {"max_pixels": 112 * 112},
        {"max_tokens": 128},
        {"min_frames": 4},
    ):
        assert cache_key(str(copy), SamplingConfig(**{**SAMPLING.__dict__, **change})) != base, change
    assert cache_key(str(copy), SAMPLING, "raw") != base  # the format
    os.utime(copy, ns=(0, 10**18))
    assert cache_key(str(copy), SAMPLING) != base  # mtime
    copy.write_bytes(copy.read_bytes() + b"\0")
    assert cache_key(str(copy), SAMPLING) != base  # size and content


@pytest.mark.parametrize("fmt", ["raw", "jpeg"])
def test_round_trip_and_the_dataset_reads_the_cache(tmp_path, fmt):
    video = read_video(VIDEO, SAMPLING)
    write_cache(tmp_path, VIDEO, SAMPLING, video, fmt)
    cached = read_cached(tmp_path, VIDEO, SAMPLING, fmt)
    assert cached.metadata == video.metadata and cached.frames.shape == video.frames.shape
    assert cached.frames.dtype == torch.uint8
    if fmt == "raw":
        assert torch.equal(cached.frames, video.frames)
    else:
        assert psnr(cached.frames, video.frames) >= MIN_JPEG_PSNR
    # Plant a recognisable entry: the dataset must return it rather than decode.
    write_cache(
        tmp_path,
        VIDEO,
        SAMPLING,
        type(video)(frames=torch.zeros_like(video.frames), metadata=video.metadata),
        fmt,
    )
    dataset = build_dataset(
        SAMPLES / "train.jsonl", sampling=SAMPLING, cache_dir=str(tmp_path), cache_format=fmt
    )
    row = dataset[3]
    assert row["video"] == VIDEO and row["video_frames"].sum() == 0
    assert dataset[4]["video_frames"].sum() > 0  # no entry: decoded
    assert read_cached(tmp_path, VIDEO, SamplingConfig(fps=2.0), fmt) is None  # other settings never reuse it


def test_formats_coexist_and_old_raw_entries_are_read(tmp_path):
    video = read_video(VIDEO, SAMPLING)
    # An entry exactly as the previous version wrote it: its key had no format, its header no "format".
    stat = os.stat(VIDEO)
    identity = {
        "path": os.path.abspath(VIDEO),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sampling": SAMPLING.__dict__,
        "version": 2,
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    old = tmp_path / key[:2] / f"{key}.safetensors"
    old.parent.mkdir()
    save_file(
        {"frames": video.frames.contiguous()},
        str(old),
        metadata={"video_metadata": json.dumps(video.metadata)},
    )
    assert cache_path(tmp_path, VIDEO, SAMPLING, "raw") == old
    assert torch.equal(read_cached(tmp_path, VIDEO, SAMPLING, "raw").frames, video.frames)
    # A jpeg reader with only the raw entry takes it (exact frames beat no entry) ...
    assert torch.equal(read_cached(tmp_path, VIDEO, SAMPLING, "jpeg").frames, video.frames)
    # ... and once a jpeg entry exists beside it, each reader gets its own format.
    jpeg_entry = write_cache(tmp_path, VIDEO, SAMPLING, video, "jpeg")
    assert jpeg_entry != old and old.is_file() and jpeg_entry.name.endswith(".jpeg.safetensors")
    from_jpeg = read_cached(tmp_path, VIDEO, SAMPLING, "jpeg").frames
    assert not torch.equal(from_jpeg, video.frames) and psnr(from_jpeg, video.frames) >= MIN_JPEG_PSNR
    assert torch.equal(read_cached(tmp_path, VIDEO, SAMPLING, "raw").frames, video.frames)
    # A raw reader never settles for a jpeg entry.
    old.unlink()
    assert read_cached(tmp_path, VIDEO, SAMPLING, "raw") is None
    # A damaged entry is skipped (the video is decoded), not a crash mid-training.
    jpeg_entry.write_bytes(jpeg_entry.read_bytes()[:100])
    assert read_cached(tmp_path, VIDEO, SAMPLING, "jpeg") is None


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
def test_training_reads_the_cache(tiny_model_dir, tmp_path, monkeypatch, fmt):
    dataset = build_dataset(
        SAMPLES / "train.jsonl",
        sampling=SAMPLING,
        cache_dir=str(tmp_path / "cache"),
        cache_format=fmt,
        max_samples=2,
    )
    videos = sorted(set(dataset.with_format(None)["video"]))
    assert preprocess(videos, SAMPLING, str(tmp_path / "cache"), quiet=True, fmt=fmt) == {}
    decoded = {video: read_video(video, SAMPLING).frames for video in videos}

    def no_decoding(path, cfg):
        raise AssertionError(f"{path} was decoded: training did not read the {fmt} cache")

    monkeypatch.setattr(
        frame_cache, "read_video", no_decoding
    )  # from here on every frame must come from the cache
    for row in dataset:
        frames = row["video_frames"]
        if fmt == "raw":
            assert torch.equal(frames, decoded[row["video"]])
        else:  # lossy (so the jpeg entry, not a decode), and within the stated fidelity
            assert not torch.equal(frames, decoded[row["video"]])
            assert psnr(frames, decoded[row["video"]]) >= MIN_JPEG_PSNR
    trainer = make_trainer(tiny_model_dir, dataset, tmp_path)
    probe = ForwardProbe(trainer.model)
    trainer.train()
    assert probe.loss_forwards and all(f["pixel_values_videos"] is not None for f in probe.loss_forwards)
    assert trainer.state.global_step == 1


def test_failed_write_leaves_no_entry(tmp_path, monkeypatch):
    import safetensors.torch

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        write_cache(tmp_path, VIDEO, SAMPLING, read_video(VIDEO, SAMPLING))
    assert not cache_path(tmp_path, VIDEO, SAMPLING).exists()
    assert not list(tmp_path.rglob("*.safetensors"))


def test_killed_preprocess_leaves_only_complete_entries(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "train_file": str(SAMPLES / "train.jsonl"),
                "eval_file": str(SAMPLES / "test.jsonl"),
                "video_fps": 4.0,
                "video_max_frames": 256,
                "video_max_pixels": 112 * 112,
                "video_min_pixels": 784,
                "video_max_tokens": 100_000,
            }
        )
    )
    cache = tmp_path / "cache"
    cmd = [
        sys.executable,
        "-m",
        "video_grpo.preprocess",
        "--config",
        str(recipe),
        "--frame_cache_dir",
        str(cache),
        "--model_family",
        "qwen2_5_vl",
    ]  # the recipe names no model, so no config.json to read it from
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(cache.rglob("*.safetensors"))) < 3:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    entries = list(cache.rglob("*.safetensors"))
    assert 3 <= len(entries) < 24, "kill the run part-way"
    for entry in entries:
        if entry.name.startswith(".tmp-"):
            continue  # an interrupted write: never picked up, it does not match any key
        assert entry.name.endswith(".jpeg.safetensors")  # the default format
        assert read_entry(entry).frames.dtype == torch.uint8
    # Rerunning completes the rest and exits 0.
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cached 24 of 24 videos" in done.stdout


def test_preprocess_estimates_its_size_and_dry_run_writes_nothing(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "train_file": str(SAMPLES / "train.jsonl"),
                "video_fps": 1.0,
                "video_max_frames": 16,
                "video_max_pixels": 56 * 56,
                "video_min_pixels": 784,
                "video_max_tokens": 256,
            }
        )
    )
    cache = tmp_path / "cache"
    argv = [
        "--config",
        str(recipe),
        "--frame_cache_dir",
        str(cache),
        "--model_family",
        "qwen2_5_vl",
        "--estimate_samples",
        "3",
    ]
    assert preprocess_main([*argv, "--dry_run"]) == 0
    dry = capsys.readouterr().out
    estimated = int(re.search(r"estimated cache size: .* \((\d+) bytes\) for 16 videos", dry).group(1))
    assert not cache.exists(), "--dry_run wrote to the cache"
    assert preprocess_main(argv) == 0
    done = capsys.readouterr().out
    assert f"({estimated} bytes)" in done.splitlines()[0]  # the estimate comes first ...
    real = int(
        re.search(r"cache size: .* \((\d+) bytes\) in 16 jpeg entries", done.splitlines()[-1]).group(1)
    )
    assert real == sum(
        entry.stat().st_size for entry in cache.rglob("*.jpeg.safetensors")
    )  # ... the real total last
    assert 0.75 * real <= estimated <= 1.25 * real
