"""scripts/convert_charades_sta.py on the real Charades-STA annotations (skipped when ../shared is absent)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from video_grpo.data import read_jsonl

from .conftest import REFERENCE, REPO

CHARADES = REFERENCE / "charades_sta"
pytestmark = pytest.mark.skipif(not CHARADES.is_dir(), reason=f"{CHARADES} absent")


def run(*args: str) -> str:
    cmd = [sys.executable, str(REPO / "scripts" / "convert_charades_sta.py"), *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def test_test_split_from_txt_and_csv(tmp_path):
    out = tmp_path / "test.jsonl"
    summary = run("--txt", str(CHARADES / "charades_sta_test.txt"), "--csv", str(CHARADES / "Charades_v1_test.csv"),
                  "--out", str(out))
    records = read_jsonl(out)  # also validates every record
    assert len(records) == 3720 and len({r["video"] for r in records}) == 1334
    assert "'clamped_end_to_duration': 562" in summary
    first = json.loads(out.read_text().splitlines()[0])
    assert first["video"] == "3MSZA.mp4" and first["solution"] == [24.3, 30.4]
    assert first["sentence"] == "person turn a light on."


def test_train_split_from_timezero_json(tmp_path):
    out = tmp_path / "train.jsonl"
    summary = run("--json", str(CHARADES / "timezero_json" / "train.json"), "--out", str(out))
    assert "'dropped_start_ge_end': 4" in summary
    assert len(read_jsonl(out)) == 12408 - 4
