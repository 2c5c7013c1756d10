"""Shared fixtures: a tiny Qwen2.5-VL built once per session, and the committed sample videos."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data_samples"
REFERENCE = REPO.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from video_grpo.toys.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2_5_vl")


@pytest.fixture(scope="session")
def train_file() -> Path:
    return SAMPLES / "train.jsonl"


@pytest.fixture(scope="session")
def family_model(tmp_path_factory):
    """``family_model("qwen3_vl")``: a tiny model of that family, built once per session."""
    from video_grpo.toys.tiny import build_tiny_model

    built = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_model(
                tmp_path_factory.mktemp(family) / f"tiny-{family}", family=family
            )
        return built[family]

    return get
