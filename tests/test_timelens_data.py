"""TimeLens-100K and TimeLens-Bench loaders (fixtures in data_samples/timelens written from the published schema),
and `evaluate`'s metrics on a TimeLens-Bench file with answers in TimeLens's sentence."""

from __future__ import annotations

import json
import re

import pytest

from video_grpo.data.annotations import AnnotationError, detect_format, load_annotations
from video_grpo.evaluate import prediction_record, score_records

from .conftest import SAMPLES

TIMELENS = SAMPLES / "timelens"
TRAIN = TIMELENS / "timelens-100k.jsonl"
BENCH = TIMELENS / "charades-timelens.json"


def test_formats_are_detected():
    assert detect_format(TRAIN) == "timelens_100k"
    assert detect_format(BENCH) == "timelens_bench"
    assert detect_format(SAMPLES / "train.jsonl") == "jsonl"  # the other formats still read as before


def test_timelens_100k_gives_one_query_per_event(tmp_path):
    records, report = load_annotations(TRAIN, video_root=tmp_path)
    # 6 events on 3 lines; the last event ends at 95 s in a 90 s video: clamped, as for every format
    assert [r["id"] for r in records] == [
        "cosmo_cap/clip_a_0",
        "cosmo_cap/clip_a_1",
        "didemo/clip_b_0",
        "hirest/clip_c_0",
        "hirest/clip_c_1",
        "hirest/clip_c_2",
    ]
    assert report.records == 6 and report.videos == 3 and report.clamped_spans == ["hirest/clip_c_2"]
    first, second = records[0], records[1]
    assert first["video"] == str((tmp_path / "cosmo_cap/clip_a.mp4").resolve())
    assert first["duration"] == 40.0 and first["solution"] == [2.0, 7.5]
    assert (
        first["sentence"] == "a man opens the door"
    )  # TimeLens's parse_query: spaces folded, period dropped
    assert second["solution"] == [10.0, 14.0]  # a one-span list reads as that span
    assert records[-1]["solution"] == [85.0, 90.0] and records[-1]["solution_raw"] == [85.0, 95.0]


def test_timelens_bench_gives_one_query_per_span(tmp_path):
    records, report = load_annotations(BENCH, video_root=tmp_path)
    assert [r["id"] for r in records] == ["AO8RW_0", "AO8RW_1", "Y6R7T_0", "Y6R7T_1", "Y6R7T_2"]
    assert records[0]["video"] == str((tmp_path / "AO8RW.mp4").resolve())  # id + the first extension
    assert records[0]["sentence"] == "a person opens a door" and records[3]["sentence"] == "a person laughs"
    assert records[4]["solution"] == [20.0, 30.0] and records[4]["duration"] == 30.0
    assert report.records == 5 and report.videos == 2 and len(report.missing_videos) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"video_path": "a.mp4", "duration": 9, "source": "x", "events": [{"query": "q", "span": [1, 2]}]}\n'
            "{not json\n",
            ":2: not valid JSON",
        ),
        (
            '{"video_path": "a.mp4", "duration": 9, "source": "x", "events": [{"query": "q"}]}\n',
            ":1 event 0: missing field(s) ['span']",
        ),
        ('{"video_path": "a.mp4", "duration": 9, "source": "x", "events": []}\n', ":1: events must be"),
        (
            '{"video_path": "a.mp4", "source": "x", "events": [{"query": "q", "span": [1, 2]}]}\n',
            ":1: missing field(s) ['duration']",
        ),
        (
            '{"video_path": "a.mp4", "duration": 9, "source": "x", "events": [{"query": "q", "span": [1]}]}\n',
            ":1 event 0: expected [start, end]",
        ),
    ],
)
def test_malformed_timelens_100k_lines_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(AnnotationError, match=re.escape("t.jsonl" + message)):
        load_annotations(path, dataset_format="timelens_100k")


def test_malformed_timelens_bench_names_the_video(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"V1": {"duration": 9, "spans": [[1, 2]], "queries": ["a", "b"]}}))
    with pytest.raises(
        AnnotationError, match=r"bench.json: video V1: spans and queries must be lists of one"
    ):
        load_annotations(path)
    path.write_text('{"V1": {"duration": 9,\n "spans": [[1, 2]] "queries": ["a"]}}')
    with pytest.raises(AnnotationError, match=r"bench.json:2: not valid JSON"):
        load_annotations(path)


def test_evaluate_scores_a_timelens_bench_file_by_hand(tmp_path):
    """Answers in TimeLens's sentence, metrics worked out by hand:
    IoUs 1 ([0,10] vs [0,10]), 1/3 ([10,20] vs [5,15]), 0.6 ([12,18] vs [10,20]), 0 (no span), 2/3 ([15,30] vs
    [20,30]): R1@0.3 = 4/5, R1@0.5 = 3/5, R1@0.7 = 1/5, mIoU = 2.6/5."""
    rows, _ = load_annotations(BENCH, video_root=tmp_path)
    answers = {
        "AO8RW_0": "The event happens in 0.0 - 10.0 seconds.",
        "AO8RW_1": "The event happens in 10.0 - 20.0 seconds.",
        "Y6R7T_0": "The event happens in 12.0 - 18.0 seconds.",
        "Y6R7T_1": "I cannot tell.",
        "Y6R7T_2": "The event happens in 15.0 - 30.0 seconds.",
    }
    metrics = score_records([prediction_record(row, answers[row["id"]]) for row in rows])
    assert metrics["num_queries"] == 5 and metrics["num_parse_failures"] == 1
    assert metrics["R1@0.3"] == pytest.approx(80.0)
    assert metrics["R1@0.5"] == pytest.approx(60.0)
    assert metrics["R1@0.7"] == pytest.approx(20.0)
    assert metrics["mIoU"] == pytest.approx(52.0)
