"""The frame cache: keys, atomic writes (including a real SIGKILL), use by training, and the preprocess CLI."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors import safe_open

from video_grpo.data import build_dataset
from video_grpo.video import SamplingConfig, cache_key, cache_path, read_cached, read_video, write_cache

from .conftest import REPO, SAMPLES

SAMPLING = SamplingConfig(fps=1.0, min_frames=2, max_frames=8, min_pixels=784, max_pixels=56 * 56, max_tokens=64)
VIDEO = str(SAMPLES / "videos" / "train_003.mp4")


def test_key_covers_file_and_every_sampling_setting(tmp_path):
    copy = tmp_path / "v.mp4"
    shutil.copy(VIDEO, copy)
    base = cache_key(str(copy), SAMPLING)
    for change in ({"fps": 2.0}, {"max_frames": 16}, {"min_pixels": 2 * 784}, {"max_pixels": 112 * 112},
                   {"max_tokens": 128}, {"min_frames": 4}):
        assert cache_key(str(copy), SamplingConfig(**{**SAMPLING.__dict__, **change})) != base, change
    os.utime(copy, ns=(0, 10**18))
    assert cache_key(str(copy), SAMPLING) != base  # mtime
    copy.write_bytes(copy.read_bytes() + b"\0")
    assert cache_key(str(copy), SAMPLING) != base  # size and content


def test_round_trip_and_training_reads_the_cache(tmp_path):
    video = read_video(VIDEO, SAMPLING)
    write_cache(tmp_path, VIDEO, SAMPLING, video)
    cached = read_cached(tmp_path, VIDEO, SAMPLING)
    assert torch.equal(cached.frames, video.frames) and cached.metadata == video.metadata
    # Plant a recognisable entry: the dataset must return it rather than decode.
    write_cache(tmp_path, VIDEO, SAMPLING, type(video)(frames=torch.zeros_like(video.frames), metadata=video.metadata))
    dataset = build_dataset(SAMPLES / "train.jsonl", sampling=SAMPLING, cache_dir=str(tmp_path))
    row = dataset[3]
    assert row["video"] == VIDEO and row["video_frames"].sum() == 0
    assert dataset[4]["video_frames"].sum() > 0  # no entry: decoded
    assert read_cached(tmp_path, VIDEO, SamplingConfig(fps=2.0)) is None  # other settings never reuse it


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
    recipe.write_text(yaml.safe_dump({"train_file": str(SAMPLES / "train.jsonl"), "eval_file": str(SAMPLES / "test.jsonl"),
                                      "video_fps": 4.0, "video_max_frames": 256, "video_max_pixels": 112 * 112,
                                      "video_min_pixels": 784, "video_max_tokens": 100_000}))
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "video_grpo.preprocess", "--config", str(recipe), "--frame_cache_dir", str(cache),
           "--model_family", "qwen2_5_vl"]  # the recipe names no model, so no config.json to read it from
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
        with safe_open(str(entry), framework="pt") as f:
            assert f.get_tensor("frames").dtype == torch.uint8
    # Rerunning completes the rest and exits 0.
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cached 24 of 24 videos" in done.stdout
