"""The TimeLens family's annotation formats: TimeLens-Bench, TimeLens-100K and TimeLens2-93K.

Each reader yields ``(where, id, video_key, duration, spans, sentence)`` for :func:`video_grpo.data.annotations.
load_annotations`, which validates and normalises every format alike.

- ``timelens_bench``: TimeLens-Bench JSON (Charades-, ActivityNet-, QVHighlights-TimeLens),
  ``{video_id: {"duration", "spans", "queries"}}``, ``spans[i]`` answering ``queries[i]``; ids ``<video_id>_<i>``.
- ``timelens_100k``: TimeLens-100K JSONL (TencentARC/TimeLens), one video per line,
  ``{"video_path", "duration", "source", "events": [{"query", "span"}, ...]}``: each event is one query, its id
  the video path without extension plus ``_<n>`` (numbered over the file, like ``charades_txt``).
- ``timelens2_93k``: TimeLens2-93K's raw annotations (MCG-NJU/TimeLens2, ``TimeLens2-93K_raw_annotations.jsonl``),
  one video per line, ``{"video_id", "annotations": [{"text", "timestamps"}, ...]}``; ``timestamps`` is one
  ``[start, end]`` or a list of them (a query whose evidence recurs). Each annotation is one query, id
  ``<video_id>_<n>``, video ``<video_id>`` plus the first extension found (theirs are ``.mp4``). The file has no
  durations: they come from ``durations_file`` (a CSV with ``id`` and ``length`` columns, id = ``video_id``)
  or, without one, from each video when the annotations load (``duration`` None here).
"""

from __future__ import annotations

import re
from pathlib import Path

from video_grpo.data.annotation_files import (
    AnnotationError,
    as_spans,
    need_fields,
    read_jsonl_lines,
    read_per_video_json,
)


def timelens_query(query) -> str:
    """A TimeLens query as their loader cleans it (timelens/dataset/timelens_data.py ``parse_query``): runs of
    whitespace become one space, and trailing periods go, since the prompt quotes it inside a sentence."""
    return re.sub(r"\s+", " ", str(query)).strip().strip(".").strip()


def read_timelens_bench(path: Path, durations: dict | None):
    for where, query_id, vid, duration, span, query in read_per_video_json(path, "spans", "queries"):
        yield where, query_id, vid, duration, span, timelens_query(query)


def read_timelens_100k(path: Path, durations: dict | None):
    counter: dict[str, int] = {}
    for where, record in read_jsonl_lines(path):
        need_fields(record, ("video_path", "duration", "events"), where)
        events = record["events"]
        if not isinstance(events, list) or not events:
            raise AnnotationError(
                f"{where}: events must be a non-empty list of {{query, span}}, got {events!r}"
            )
        video = str(record["video_path"])
        stem = str(Path(video).with_suffix(""))
        for index, event in enumerate(events):
            at = f"{where} event {index}"
            if not isinstance(event, dict):
                raise AnnotationError(f"{at}: expected {{query, span}}, got {event!r}")
            need_fields(event, ("query", "span"), at)
            number = counter[stem] = counter.get(stem, -1) + 1
            yield (
                at,
                f"{stem}_{number}",
                video,
                record["duration"],
                event["span"],
                timelens_query(event["query"]),
            )


def read_timelens2_93k(path: Path, durations: dict | None):
    """The query text is kept as written (stripped): TimeLens2's prompt quotes it whole."""
    counter: dict[str, int] = {}
    for where, record in read_jsonl_lines(path):
        need_fields(record, ("video_id", "annotations"), where)
        video_id, annotations = record["video_id"], record["annotations"]
        if not isinstance(video_id, str | int) or isinstance(video_id, bool) or not str(video_id).strip():
            raise AnnotationError(f"{where}: video_id must be a non-empty string, got {video_id!r}")
        video_id = str(video_id).strip()
        if not isinstance(annotations, list) or not annotations:
            raise AnnotationError(
                f"{where} (video {video_id}): annotations must be a non-empty list of {{text, timestamps}}, "
                f"got {annotations!r}"
            )
        if durations is not None and video_id not in durations:
            raise AnnotationError(
                f"{where}: video {video_id} has no duration in durations_file; add a row for it, or unset "
                "durations_file to read every video's length from the video itself"
            )
        duration = durations[video_id] if durations is not None else None
        for index, item in enumerate(annotations):
            at = f"{where} (video {video_id}) annotation {index}"
            if not isinstance(item, dict):
                raise AnnotationError(f"{at}: expected {{text, timestamps}}, got {item!r}")
            need_fields(item, ("text", "timestamps"), at)
            if not isinstance(item["text"], str) or not item["text"].strip():
                raise AnnotationError(f"{at}: text must be a non-empty string, got {item['text']!r}")
            as_spans(item["timestamps"], f"{at} timestamps")
            number = counter[video_id] = counter.get(video_id, -1) + 1
            yield at, f"{video_id}_{number}", video_id, duration, item["timestamps"], item["text"]
