"""The learning run (about 2 minutes): SFT then GRPO on the synthetic task must raise the IoU reward over
its start and the test mIoU over the SFT model's. Deselect with `-m "not learning"`. Numbers and the
curve: docs/learning.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.learning


def test_grpo_raises_iou_over_its_start():
    result = subprocess.run([sys.executable, "-m", "video_grpo.bench", "learning"], cwd=REPO,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = {line["name"]: line for line in map(json.loads, result.stdout.splitlines())}  # JSON lines only
    print(json.dumps(lines, indent=1))
    learning = lines["learning_iou"]
    assert learning["steps"] == 80
    assert learning["ours"] > learning["baseline"], learning  # last 20% of steps above the first 20%
    assert lines["test_iou_before_after"]["ours"] > lines["test_iou_before_after"]["baseline"]
