"""`python -m video_grpo.data check` on real files: summary, JSON, exit status."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from .conftest import REPO, SAMPLES


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "video_grpo.data", "check", *args], cwd=REPO,
                          capture_output=True, text=True)


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
    rows = [("good", "good.mp4", [1, 2]), ("empty", "empty.mp4", [1, 2]), ("text", "text.mp4", [1, 2]),
            ("gone", "gone.mp4", [1, 2]), ("reversed", "good.mp4", [3, 1]), ("late", "good.mp4", [30, 99])]
    annotations = tmp_path / "a.jsonl"
    annotations.write_text("".join(json.dumps({"id": i, "video": v, "duration": 34.0, "solution": s, "sentence": "x"})
                                   + "\n" for i, v, s in rows))
    result = check("--annotations", str(annotations), "--video_root", str(videos), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["records"] == 5 and report["videos"] == 4
    assert report["invalid_spans"] == ["reversed"] and report["clamped_spans"] == ["late"]
    assert report["missing_videos"] == [str(videos / "gone.mp4")]
    assert sorted(u.split(":")[0] for u in report["unreadable_videos"]) == [str(videos / "empty.mp4"),
                                                                           str(videos / "text.mp4")]
    human = check("--annotations", str(annotations), "--video_root", str(videos))
    assert human.returncode == 1 and "NOT READY" in human.stdout and "gone.mp4" in human.stdout
    strict = check("--annotations", str(annotations), "--video_root", str(videos), "--strict")
    assert strict.returncode == 2 and "a.jsonl:4" in strict.stderr
