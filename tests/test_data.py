import json

import pytest
import torch

from video_grpo.data import AnnotationError, build_dataset, read_jsonl
from video_grpo.video import SamplingConfig

SAMPLING = SamplingConfig(fps=1.0, max_frames=8, min_pixels=784, max_pixels=112 * 112, max_tokens=256)


@pytest.fixture(scope="module")
def dataset(train_file):
    return build_dataset(train_file, sampling=SAMPLING)


def _check_row(row):
    frames = row["video_frames"]
    assert isinstance(frames, torch.Tensor) and frames.ndim == 4 and frames.dtype == torch.uint8
    assert row["video_metadata"]["frames_indices"]
    assert row["prompt"][0]["content"][0] == {"type": "video"}
    assert row["sentence"] in row["prompt"][0]["content"][1]["text"]
    assert len(row["solution"]) == 2 and row["duration"] > 0


def test_single_access(dataset):
    _check_row(dataset[3])


def test_list_access(dataset):
    batch = dataset[[0, 5]]
    assert len(batch["video_frames"]) == 2
    for i in range(2):
        _check_row({k: v[i] for k, v in batch.items()})


def test_repeated_rows_share_one_decode(dataset):
    batch = dataset.__getitems__([2, 2, 2, 7])
    assert batch[0]["video_frames"] is batch[1]["video_frames"] is batch[2]["video_frames"]
    assert batch[3]["video_frames"] is not batch[0]["video_frames"]


def test_after_shuffle_and_select(dataset):
    subset = dataset.shuffle(seed=0).select([0, 1, 2])
    ids = [subset[i]["id"] for i in range(3)]
    for i in range(3):
        _check_row(subset[i])
    assert ids == subset[[0, 1, 2]]["id"]


def test_bad_annotation_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"id": "a", "video": "a.mp4", "duration": 10, "solution": [1, 2], "sentence": "x"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "solution": [5, 2]}) + "\n")
    with pytest.raises(AnnotationError, match=r"bad.jsonl:2: 'solution' needs 0 <= start < end"):
        read_jsonl(path)
    path.write_text(json.dumps({"id": "a"}) + "\n")
    with pytest.raises(AnnotationError, match=r"bad.jsonl:1: missing field"):
        read_jsonl(path)
