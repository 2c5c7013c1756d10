import json
import os

import pytest
import torch

from video_grpo.data.annotations import AnnotationError, load_annotations
from video_grpo.data.dataset import VideoTransform, build_dataset
from video_grpo.data.video import SamplingConfig

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
    (tmp_path / "a.mp4").write_bytes(b"x")
    good = {"id": "a", "video": "a.mp4", "duration": 10, "solution": [1, 2], "sentence": "x"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "solution": [5, 2]}) + "\n")
    with pytest.raises(AnnotationError, match=r"bad.jsonl:2: span \[5.0, 2.0\] needs 0 <= start < end"):
        load_annotations(path, strict=True)
    records, report = load_annotations(path)  # default policy: skip and count
    assert len(records) == 1 and report.invalid_spans == ["a"]
    path.write_text(json.dumps({"id": "a"}) + "\n")
    with pytest.raises(AnnotationError, match=r"bad.jsonl:1: missing field"):
        load_annotations(path)
    path.write_text("{not json\n")
    with pytest.raises(AnnotationError, match=r"bad.jsonl:1: not valid JSON"):
        load_annotations(path)


class PidTransform(VideoTransform):
    """Records which process decoded each row."""

    def __call__(self, batch):
        batch = super().__call__(batch)
        batch["decoded_by"] = [os.getpid()] * len(batch["video"])
        return batch


def test_decoding_runs_in_dataloader_workers_once_per_video(tiny_model_dir, train_file, tmp_path):
    from .test_trainer import make_trainer

    dataset = build_dataset(train_file, sampling=SAMPLING)
    dataset.set_transform(PidTransform(SAMPLING))
    trainer = make_trainer(tiny_model_dir, dataset, tmp_path, dataloader_num_workers=2)
    batch = next(iter(trainer.get_train_dataloader()))
    assert len(batch) == 4 and all(row["decoded_by"] != os.getpid() for row in batch)
    by_video = {}
    for row in batch:
        by_video.setdefault(row["video"], []).append(row["video_frames"])
    assert len(by_video) == 2  # 4 rows = 2 prompts x 2 generations
    for frames in by_video.values():
        assert frames[0] is frames[1]  # the G repeats share one decode
