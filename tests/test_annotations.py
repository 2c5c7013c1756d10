"""Annotation loaders on the real public files in ../shared/reference (skipped when absent), and the policy."""

from __future__ import annotations

import json

import pytest

from video_grpo.data.annotations import AnnotationError, detect_format, load_annotations

from .conftest import REFERENCE, SAMPLES

CHARADES = REFERENCE / "charades_sta"
needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"{REFERENCE} absent")


@needs_reference
def test_charades_sta_test_txt_with_csv_durations():
    records, report = load_annotations(
        CHARADES / "charades_sta_test.txt",
        durations_file=CHARADES / "Charades_v1_test.csv",
        video_root="/videos",
    )
    assert report.records == 3720 and report.videos == 1334
    assert len(report.clamped_spans) == 562 and not report.invalid_spans
    first = records[0]
    assert first["video"] == "/videos/3MSZA.mp4" and first["solution"] == [24.3, 30.4]
    assert first["sentence"] == "person turn a light on." and first["duration"] == pytest.approx(30.96)
    clamped = next(r for r in records if r["id"] == report.clamped_spans[0])
    assert (
        clamped["solution"][1] == clamped["duration"] < clamped["solution_raw"][1]
    )  # raw span kept for eval


@needs_reference
def test_charades_train_json_skips_the_four_reversed_spans():
    _, report = load_annotations(CHARADES / "timezero_json" / "train.json")
    assert len(report.invalid_spans) == 4 and report.records == 12408 - 4


@needs_reference
def test_activitynet_val_2():
    records, report = load_annotations(REFERENCE / "activitynet" / "val_2.json")
    assert report.records == 17031 and report.videos == 4885
    assert (
        len(report.clamped_spans) == 1
    )  # one window ends 0.01 s after its video; float noise is not counted
    assert all(r["sentence"] == r["sentence"].strip() for r in records)


@needs_reference
def test_qvhighlights_val_multi_window():
    records, report = load_annotations(REFERENCE / "qvhighlights" / "highlight_val_release.jsonl")
    assert report.records == 1550 and report.videos == 1519
    assert all(isinstance(r["solution"][0], list) for r in records)
    assert sum(len(r["solution"]) for r in records) == 2803


def test_format_detection(tmp_path):
    assert detect_format(SAMPLES / "train.jsonl") == "jsonl"
    qv = tmp_path / "qv.jsonl"
    qv.write_text(
        json.dumps({"qid": 1, "query": "q", "duration": 10, "vid": "v", "relevant_windows": [[1, 2]]}) + "\n"
    )
    assert detect_format(qv) == "qvhighlights"
    assert detect_format(tmp_path / "a.txt") == "charades_txt"
    with pytest.raises(AnnotationError, match="set dataset_format"):
        detect_format(tmp_path / "a.csv")


def test_policy_and_strict(tmp_path):
    (tmp_path / "v1.webm").write_bytes(b"x")
    path = tmp_path / "a.jsonl"
    rows = [
        {"id": "ok", "video": "v1", "duration": 10, "solution": [1, 2], "sentence": " s "},
        {"id": "late", "video": "v1", "duration": 10, "solution": [8, 12], "sentence": "s"},
        {"id": "reversed", "video": "v1", "duration": 10, "solution": [5, 5], "sentence": "s"},
        {"id": "gone", "video": "nope.mp4", "duration": 10, "solution": [1, 2], "sentence": "s"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records, report = load_annotations(path)
    assert [r["id"] for r in records] == ["ok", "late", "gone"]
    assert records[0]["video"] == str((tmp_path / "v1.webm").resolve())  # id + first existing extension
    assert records[0]["sentence"] == "s"
    assert records[1]["solution"] == [8.0, 10.0] and records[1]["solution_raw"] == [8.0, 12.0]
    assert report.invalid_spans == ["reversed"] and report.clamped_spans == ["late"]
    assert report.missing_videos == [str((tmp_path / "nope.mp4").resolve())] and not report.can_train
    with pytest.raises(AnnotationError, match=r"a.jsonl:2: span \[8.0, 12.0\] ends after the video"):
        load_annotations(path, strict=True)


def test_charades_txt_needs_durations(tmp_path):
    path = tmp_path / "sta.txt"
    path.write_text("AAAAA 1.0 3.0##person opens a door.\n")
    with pytest.raises(AnnotationError, match="set durations_file"):
        load_annotations(path)
    csv_path = tmp_path / "d.csv"
    csv_path.write_text('id,script,length\nAAAAA,"a\nmultiline script",12.5\n')
    records, _ = load_annotations(path, durations_file=csv_path)
    assert records[0]["duration"] == 12.5 and records[0]["id"] == "AAAAA_0"
