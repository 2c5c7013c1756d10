"""`python -m video_grpo.data check` on real files: summary, JSON, exit status, recipe errors, and no reward
plug-in imports in the data tools."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from video_grpo.data.check import check_main
from video_grpo.data.check import main as data_main
from video_grpo.grpo import parse_args
from video_grpo.preprocess import main as preprocess_main

from .conftest import REPO, SAMPLES


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "video_grpo.data", "check", *args], cwd=REPO, capture_output=True, text=True
    )


def test_help_answers_and_a_missing_command_fails(capsys):
    """``python -m video_grpo.data --help`` answers (the docs test runs it), without a command it fails."""
    assert data_main(["--help"]) == 0 and "python -m video_grpo.data check" in capsys.readouterr().out
    assert data_main([]) == 2 and "usage:" in capsys.readouterr().err


def test_clean_data_passes():
    # The recipe's tiny model is built by `make demo`, not here: the family is named instead of read from it.
    result = check("--config", "configs/grpo/demo_tiny.yaml", "--decode", "--model_family", "qwen2_5_vl")
    assert result.returncode == 0, result.stderr
    assert "16 usable queries over 16 videos" in result.stdout and "OK: the data can train." in result.stdout


def test_broken_data_is_listed_and_fails(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    shutil.copy(SAMPLES / "videos" / "train_000.mp4", videos / "good.mp4")
    (videos / "empty.mp4").write_bytes(b"")
    (videos / "text.mp4").write_text("not a video")
    rows = [
        ("good", "good.mp4", [1, 2]),
        ("empty", "empty.mp4", [1, 2]),
        ("text", "text.mp4", [1, 2]),
        ("gone", "gone.mp4", [1, 2]),
        ("reversed", "good.mp4", [3, 1]),
        ("late", "good.mp4", [30, 99]),
    ]
    annotations = tmp_path / "a.jsonl"
    annotations.write_text(
        "".join(
            json.dumps({"id": i, "video": v, "duration": 34.0, "solution": s, "sentence": "x"}) + "\n"
            for i, v, s in rows
        )
    )
    result = check("--annotations", str(annotations), "--video_root", str(videos), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["records"] == 5 and report["videos"] == 4
    assert report["invalid_spans"] == ["reversed"] and report["clamped_spans"] == ["late"]
    assert report["missing_videos"] == [str(videos / "gone.mp4")]
    assert sorted(u.split(":")[0] for u in report["unreadable_videos"]) == [
        str(videos / "empty.mp4"),
        str(videos / "text.mp4"),
    ]
    human = check("--annotations", str(annotations), "--video_root", str(videos))
    assert human.returncode == 1 and "NOT READY" in human.stdout and "gone.mp4" in human.stdout
    strict = check("--annotations", str(annotations), "--video_root", str(videos), "--strict")
    assert strict.returncode == 2 and "a.jsonl:4" in strict.stderr


def test_missing_durations_file_names_the_field_the_path_and_the_fix(tmp_path, capsys):
    missing = tmp_path / "Charades_v1_train.csv"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump({"train_file": str(SAMPLES / "train.jsonl"), "durations_file": str(missing)})
    )
    assert check_main(["--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "Errno" not in err
    assert f"durations_file: {str(missing)!r}, set in {recipe}, is not an existing file" in err
    assert "Fix durations_file in the recipe" in err
    # preprocess reads the same recipe the same way
    assert preprocess_main(["--config", str(recipe), "--model_family", "qwen2_5_vl", "--dry_run"]) == 2
    assert f"durations_file: {str(missing)!r}" in capsys.readouterr().err


def test_data_tools_do_not_import_reward_plugins(tmp_path, monkeypatch, capsys):
    """A plug-in the data machine cannot import (here: one that fails, leaving a trace) must not stop the data
    tools; training still imports it, and fails, before any model loads."""
    trace = tmp_path / "imported"
    (tmp_path / "broken_reward_plugin.py").write_text(
        f"open({str(trace)!r}, 'w').close()\nraise ImportError('needs a GPU library')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "train_file": str(SAMPLES / "train.jsonl"),
                "video_max_pixels": 56 * 56,
                "video_min_pixels": 784,
                "video_max_tokens": 256,
                "video_max_frames": 8,
                "reward_funcs": ["iou", "broken_reward_plugin:reward"],
                "output_dir": str(tmp_path / "out"),
            }
        )
    )
    assert check_main(["--config", str(recipe)]) == 0
    assert (
        preprocess_main(
            ["--config", str(recipe), "--model_family", "qwen2_5_vl", "--dry_run", "--estimate_samples", "1"]
        )
        == 0
    )
    assert "OK: the data can train." in capsys.readouterr().out
    assert not trace.exists(), "a data tool imported the reward plug-in"
    with pytest.raises(ValueError, match="cannot load reward plug-in 'broken_reward_plugin:reward'"):
        parse_args(["--config", str(recipe)])
    assert trace.exists()
