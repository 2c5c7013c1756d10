"""TimeLens2-93K's raw annotations (fixture in data_samples/timelens, written here in the published schema: one
JSON object per line, ``video_id`` and ``annotations`` of ``{text, timestamps}``): one record per (video, text),
multi-span answers kept, durations from the videos or a CSV, errors that name the line, the video and the field,
and ``data check`` on the fixture."""

from __future__ import annotations

import json
import re

import pytest

from video_grpo.data.annotations import AnnotationError, detect_format, load_annotations
from video_grpo.data.check import check_main

from .conftest import REPO, SAMPLES

RAW = SAMPLES / "timelens" / "timelens2-93k_raw_annotations.jsonl"
VIDEOS = SAMPLES / "videos"


def test_the_format_is_detected():
    assert detect_format(RAW) == "timelens2_93k"
    assert detect_format(SAMPLES / "timelens" / "timelens-100k.jsonl") == "timelens_100k"


def test_one_record_per_text_with_every_span_kept():
    records, report = load_annotations(RAW, video_root=VIDEOS)
    assert [r["id"] for r in records] == [
        "train_000_0",
        "train_000_1",
        "train_001_0",
        "train_002_0",
        "train_002_1",
    ]
    by_id = {r["id"]: r for r in records}
    # durations read from the videos (frames / fps: 136/4, 116/4, 196/4)
    assert [by_id[i]["duration"] for i in ("train_000_0", "train_001_0", "train_002_0")] == [34.0, 29.0, 49.0]
    assert by_id["train_000_0"]["video"] == str((VIDEOS / "train_000.mp4").resolve())
    # several spans stay a list of spans, as annotated
    multi = by_id["train_000_1"]
    assert multi["solution"] == [[0.0, 8.2], [22.7, 34.0]] == multi["solution_raw"]
    assert multi["sentence"] == "the screen is empty before and after the circle"
    # so every solution of the file is a list of spans: one span, written [[s, e]] or [s, e], is a list of one
    assert by_id["train_000_0"]["solution"] == [[8.2, 22.7]]
    assert by_id["train_001_0"]["solution"] == [[5.3, 19.5]]
    # an end past the video's own length is clamped to it, as in every format
    assert by_id["train_002_1"]["solution"] == [[40.0, 49.0]]
    assert by_id["train_002_1"]["solution_raw"] == [[40.0, 52.0]]
    assert report.records == 5 and report.videos == 3 and report.clamped_spans == ["train_002_1"]
    assert not report.missing_videos and report.can_train


def test_a_file_of_one_span_queries_gives_plain_spans(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text(
        '{"video_id": "train_001", "annotations": [{"text": "a", "timestamps": [[5.3, 19.5]]}, '
        '{"text": "b", "timestamps": [1, 2]}]}\n'
    )
    records, _ = load_annotations(path, video_root=VIDEOS)
    assert [r["solution"] for r in records] == [[5.3, 19.5], [1.0, 2.0]]


def test_the_fixture_becomes_a_dataset_the_presets_prompt():
    """One span and several in one file: the dataset's solution column holds one type (Arrow refuses [s, e] beside
    [[s, e], ...]), and a row decodes with the TimeLens2 preset's sampling and prompt."""
    from video_grpo.configs import script_args_from_yaml
    from video_grpo.data.dataset import build_dataset
    from video_grpo.data.video import SamplingConfig
    from video_grpo.inputs.families import FAMILIES

    recipe = script_args_from_yaml(str(REPO / "configs" / "grpo" / "timelens2_qwen3_vl_8b.yaml"))
    source = recipe.train_sources["timelens2-93k"]
    dataset = build_dataset(
        RAW,
        video_root=VIDEOS,
        sampling=SamplingConfig.from_args(recipe, FAMILIES["qwen3_vl"]),
        prompt_template=source["prompt_template"],
        normalize_query=source["normalize_query"],
    )
    assert dataset.with_format(None)["solution"][:2] == [[[8.2, 22.7]], [[0.0, 8.2], [22.7, 34.0]]]
    row = dataset[1]
    text = row["prompt"][0]["content"][1]["text"]
    assert text.startswith(
        'You are given a video.\nTask: temporal retrieval.\nGiven the query: "the screen is empty before and after'
    )
    assert row["video_frames"].shape[0] == 68  # 34 s at 2 fps


def test_durations_come_from_the_csv_when_given(tmp_path):
    """With durations_file no video is opened: here none exists, and the durations are the CSV's; the videos are
    listed missing. Without it a missing video's queries take their latest end, so nothing is clamped."""
    csv = tmp_path / "durations.csv"
    csv.write_text("id,length\ntrain_000,40.0\ntrain_001,20.0\ntrain_002,60.0\n")
    records, report = load_annotations(RAW, video_root=tmp_path, durations_file=csv)
    assert [r["duration"] for r in records] == [40.0, 40.0, 20.0, 60.0, 60.0]
    assert not report.clamped_spans and len(report.missing_videos) == 3 and not report.can_train
    records, report = load_annotations(RAW, video_root=tmp_path)
    assert [r["duration"] for r in records] == [22.7, 34.0, 19.5, 48.7, 52.0]
    assert not report.clamped_spans and len(report.missing_videos) == 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"annotations": [{"text": "q", "timestamps": [1, 2]}]}', ":1: missing field(s) ['video_id']"),
        ('{"video_id": "v", "annotations": []}', ":1 (video v): annotations must be a non-empty list"),
        (
            '{"video_id": "v", "annotations": [{"text": "q"}]}',
            ":1 (video v) annotation 0: missing field(s) ['timestamps']",
        ),
        (
            '{"video_id": "v", "annotations": [{"text": " ", "timestamps": [1, 2]}]}',
            ":1 (video v) annotation 0: text must be",
        ),
        (
            '{"video_id": "v", "annotations": [{"text": "q", "timestamps": [1, 2]}, {"text": "r", "timestamps": [[1, 2], [3]]}]}',
            ":1 (video v) annotation 1 timestamps: expected [start, end], got [3]",
        ),
        (
            '{"video_id": "v", "annotations": [{"text": "q", "timestamps": [[1, "x"]]}]}',
            ":1 (video v) annotation 0 timestamps: span [1, 'x'] is not numeric",
        ),
        ('{"video_id": "v", "annotations": [{"text": "q", "timestamps": [1, 2]}]', ":1: not valid JSON"),
    ],
)
def test_a_bad_record_names_the_line_the_video_and_the_field(tmp_path, line, message):
    path = tmp_path / "raw.jsonl"
    path.write_text(
        '{"video_id": "ok", "annotations": [{"text": "q", "timestamps": [1, 2]}]}\n' + line + "\n"
    )
    message = message.replace(":1", ":2", 1)  # the bad record is on the second line
    with pytest.raises(AnnotationError, match=re.escape(f"raw.jsonl{message}")):
        load_annotations(path, dataset_format="timelens2_93k", video_root=tmp_path)


def test_a_video_the_durations_file_lacks_is_named(tmp_path):
    csv = tmp_path / "durations.csv"
    csv.write_text("id,length\ntrain_000,40.0\n")
    with pytest.raises(AnnotationError, match=r"raw_annotations.jsonl:2: video train_001 has no duration"):
        load_annotations(RAW, video_root=VIDEOS, durations_file=csv)


def test_data_check_passes_the_fixture(capsys):
    assert check_main(["--annotations", str(RAW), "--video_root", str(VIDEOS), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == 5 and report["videos"] == 3 and report["clamped_spans"] == ["train_002_1"]
    assert report["missing_videos"] == report["unreadable_videos"] == []


def test_data_check_writes_a_durations_file_the_loader_reads(tmp_path, capsys):
    """`data check --write_durations` writes each video's length under its video_id; loading with that file gives
    the durations the videos gave."""
    csv = tmp_path / "durations.csv"
    args = ["--annotations", str(RAW), "--video_root", str(VIDEOS), "--json", "--write_durations", str(csv)]
    assert check_main(args) == 0
    capsys.readouterr()
    assert csv.read_text().splitlines() == ["id,length", "train_000,34.0", "train_001,29.0", "train_002,49.0"]
    probed, _ = load_annotations(RAW, video_root=VIDEOS)
    from_csv, _ = load_annotations(RAW, video_root=VIDEOS, durations_file=csv)
    assert from_csv == probed
