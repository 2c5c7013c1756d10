"""Annotation formats for temporal grounding, read into one record shape, with a stated validation policy.

Record shape (what :mod:`video_grpo.data` builds datasets from)::

    {"id", "video" (path), "duration", "solution" ([s, e] or [[s, e], ...]), "solution_raw", "sentence"}

``solution_raw`` keeps the span exactly as annotated, because published evaluations score against it;
``solution`` is what training rewards use.

Formats (``dataset_format``; auto-detected when unset):

- ``jsonl``: ours, one ``{"id", "video", "duration", "solution", "sentence"}`` per line;
- ``charades_txt``: Charades-STA ``VID start end##sentence`` lines, durations from the Charades CSV
  ``length`` column (``durations_file``);
- ``grounding_json``: ``{vid: {"duration", "timestamps", "sentences"}}``, the TimeZero/VideoChat-R1 Charades
  JSON and ActivityNet Captions (whose sentences often start with a space: all sentences are stripped);
- ``qvhighlights``: QVHighlights JSONL, several ``relevant_windows`` per query;
- ``timelens_100k``: TimeLens-100K JSONL (TencentARC/TimeLens), one video per line,
  ``{"video_path", "duration", "source", "events": [{"query", "span"}, ...]}``: each event is one query, its id
  the video path without extension plus ``_<n>`` (numbered over the file, like ``charades_txt``);
- ``timelens_bench``: TimeLens-Bench JSON (Charades-, ActivityNet-, QVHighlights-TimeLens),
  ``{video_id: {"duration", "spans", "queries"}}``, ``spans[i]`` answering ``queries[i]``; ids ``<video_id>_<i>``.

Policy, counted in :class:`DataReport`: a span with start >= end is skipped; an end past the video's
duration (by more than 5 ms of float noise) is clamped to it (a start past it makes the span invalid); a missing video is listed. With
``strict=True`` each of these raises :class:`AnnotationError` instead.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

# Ends within this much of the duration are float noise (ActivityNet stores 113.25999999999999 beside 113.26):
# they are set to the duration without being counted as clamped.
END_TOLERANCE_S = 0.005
FORMATS = ("jsonl", "charades_txt", "grounding_json", "qvhighlights", "timelens_100k", "timelens_bench")
DEFAULT_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi", ".mov")


class AnnotationError(ValueError):
    """Malformed or (in strict mode) policy-violating annotations. The message names the file and line."""


@dataclass
class DataReport:
    """What loading found. Lists hold offending query ids or video paths."""

    records: int = 0
    videos: int = 0
    invalid_spans: list[str] = field(default_factory=list)
    clamped_spans: list[str] = field(default_factory=list)
    missing_videos: list[str] = field(default_factory=list)
    unreadable_videos: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "records": self.records,
            "videos": self.videos,
            "missing_videos": self.missing_videos,
            "invalid_spans": self.invalid_spans,
            "clamped_spans": self.clamped_spans,
            "unreadable_videos": self.unreadable_videos,
        }

    @property
    def can_train(self) -> bool:
        return self.records > 0 and not self.missing_videos and not self.unreadable_videos


# -- raw readers: each yields (where, id, video_key, duration, spans, sentence) ------------------------------


def iter_jsonl_objects(path: str | Path, error: type[ValueError] = AnnotationError):
    """``(line_no, "file:line", object)`` for each non-blank line; bad JSON or a non-object raises ``error``."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise error(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise error(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield line_no, where, record


def write_jsonl(path: str | Path, records) -> None:
    """One JSON object per line, the format every reader here takes."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)


def _read_jsonl_lines(path: Path):
    for _, where, record in iter_jsonl_objects(path):
        yield where, record


def _need(record: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise AnnotationError(f"{where}: missing field(s) {missing}; each record needs {list(keys)}")


def _read_canonical(path: Path, durations: dict | None):
    for where, record in _read_jsonl_lines(path):
        _need(record, ("id", "video", "duration", "solution", "sentence"), where)
        yield (
            where,
            str(record["id"]),
            str(record["video"]),
            record["duration"],
            record["solution"],
            record["sentence"],
        )


def _read_qvhighlights(path: Path, durations: dict | None):
    for where, record in _read_jsonl_lines(path):
        _need(record, ("qid", "query", "duration", "vid", "relevant_windows"), where)
        yield (
            where,
            str(record["qid"]),
            str(record["vid"]),
            record["duration"],
            record["relevant_windows"],
            record["query"],
        )


def _read_json_object(path: Path, shape: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise AnnotationError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
    if not isinstance(data, dict):
        raise AnnotationError(f"{path}: expected {shape}, got a JSON {type(data).__name__}")
    return data


def _read_per_video_json(path: Path, span_key: str, sentence_key: str):
    """``{vid: {duration, <span_key>, <sentence_key>}}``: the grounding_json and timelens_bench layouts."""
    data = _read_json_object(path, f"{{video_id: {{duration, {span_key}, {sentence_key}}}}}")
    for vid, entry in data.items():
        where = f"{path}: video {vid}"
        if not isinstance(entry, dict):
            raise AnnotationError(f"{where}: expected an object with duration, {span_key}, {sentence_key}")
        _need(entry, ("duration", span_key, sentence_key), where)
        spans, sentences = entry[span_key], entry[sentence_key]
        if not isinstance(spans, list) or not isinstance(sentences, list) or len(spans) != len(sentences):
            raise AnnotationError(
                f"{where}: {span_key} and {sentence_key} must be lists of one length, got "
                f"{len(spans) if isinstance(spans, list) else spans!r} and "
                f"{len(sentences) if isinstance(sentences, list) else sentences!r}"
            )
        for index, (span, sentence) in enumerate(zip(spans, sentences, strict=True)):
            yield f"{where} #{index}", f"{vid}_{index}", vid, entry["duration"], span, sentence


def _read_grounding_json(path: Path, durations: dict | None):
    yield from _read_per_video_json(path, "timestamps", "sentences")


def timelens_query(query) -> str:
    """A TimeLens query as their loader cleans it (timelens/dataset/timelens_data.py ``parse_query``): runs of
    whitespace become one space, and trailing periods go, since the prompt quotes it inside a sentence."""
    return re.sub(r"\s+", " ", str(query)).strip().strip(".").strip()


def _read_timelens_bench(path: Path, durations: dict | None):
    for where, query_id, vid, duration, span, query in _read_per_video_json(path, "spans", "queries"):
        yield where, query_id, vid, duration, span, timelens_query(query)


def _read_timelens_100k(path: Path, durations: dict | None):
    counter: dict[str, int] = {}
    for where, record in _read_jsonl_lines(path):
        _need(record, ("video_path", "duration", "events"), where)
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
            _need(event, ("query", "span"), at)
            number = counter[stem] = counter.get(stem, -1) + 1
            yield (
                at,
                f"{stem}_{number}",
                video,
                record["duration"],
                event["span"],
                timelens_query(event["query"]),
            )


def read_durations_csv(path: str | Path) -> dict[str, float]:
    """``id -> length`` from a Charades CSV (quoted fields may contain newlines)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"id", "length"} <= set(reader.fieldnames):
            raise AnnotationError(
                f"{path}: expected a CSV with 'id' and 'length' columns, got {reader.fieldnames}"
            )
        return {row["id"]: float(row["length"]) for row in reader}


def _read_charades_txt(path: Path, durations: dict | None):
    if durations is None:
        raise AnnotationError(
            f"{path}: Charades-STA .txt has no durations; set durations_file to the Charades CSV"
        )
    counter: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            head, sep, sentence = line.rstrip("\n").partition("##")
            parts = head.split()
            if not sep or len(parts) != 3:
                raise AnnotationError(f"{where}: expected 'VID start end##sentence', got {line.strip()!r}")
            vid = parts[0]
            if vid not in durations:
                raise AnnotationError(f"{where}: video {vid} has no duration in durations_file")
            index = counter[vid] = counter.get(vid, -1) + 1
            yield where, f"{vid}_{index}", vid, durations[vid], [parts[1], parts[2]], sentence


READERS = {
    "jsonl": _read_canonical,
    "charades_txt": _read_charades_txt,
    "grounding_json": _read_grounding_json,
    "qvhighlights": _read_qvhighlights,
    "timelens_100k": _read_timelens_100k,
    "timelens_bench": _read_timelens_bench,
}


def detect_format(path: str | Path) -> str:
    """Guess the format from the extension and, for JSON lines, the first record's keys."""
    path = Path(path)
    if path.suffix == ".txt":
        return "charades_txt"
    if path.suffix == ".json":
        data = _read_json_object(path, "{video_id: {...}}")
        first = next(iter(data.values()), None)
        return "timelens_bench" if isinstance(first, dict) and "queries" in first else "grounding_json"
    if path.suffix == ".jsonl":
        for _, record in _read_jsonl_lines(path):
            if "relevant_windows" in record:
                return "qvhighlights"
            return "timelens_100k" if "events" in record else "jsonl"
    raise AnnotationError(
        f"{path}: cannot tell the annotation format; set dataset_format to one of {FORMATS}"
    )


def resolve_video(
    video_root: Path, key: str, extensions: tuple[str, ...], allow_outside: bool = False, where: str = ""
) -> Path:
    """``video_root/key`` if ``key`` has an extension, else the first ``video_root/key+ext`` that exists.

    Unless ``allow_outside``, a key that is absolute or climbs out of ``video_root`` is an error.
    ``video_root`` must already be resolved (the caller resolves it once per file, not per record)."""
    candidate = video_root / key
    if not allow_outside and (Path(key).is_absolute() or not candidate.resolve().is_relative_to(video_root)):
        raise AnnotationError(
            f"{where}: video {key!r} is outside video_root {str(video_root)!r}; set "
            "allow_absolute_video_paths: true if that is intended"
        )
    if Path(key).suffix:
        return candidate
    for ext in extensions:
        path = video_root / f"{key}{ext}"
        if path.exists():
            return path
    return video_root / f"{key}{extensions[0]}"


def _as_spans(raw, where: str) -> list[list[float]]:
    """Annotated span(s) as a list of [start, end] floats."""
    if isinstance(raw, list | tuple) and len(raw) == 2 and not isinstance(raw[0], list | tuple):
        raw = [raw]
    if not isinstance(raw, list | tuple) or not raw:
        raise AnnotationError(f"{where}: expected [start, end] or a list of them, got {raw!r}")
    spans = []
    for span in raw:
        if not (isinstance(span, list | tuple) and len(span) == 2):
            raise AnnotationError(f"{where}: expected [start, end], got {span!r}")
        try:
            start, end = float(span[0]), float(span[1])
        except (TypeError, ValueError) as err:
            raise AnnotationError(f"{where}: span {span!r} is not numeric") from err
        if not (math.isfinite(start) and math.isfinite(end)):
            raise AnnotationError(f"{where}: span {span!r} is not finite")
        spans.append([start, end])
    return spans


def load_annotations(
    path: str | Path,
    dataset_format: str | None = None,
    video_root: str | Path | None = None,
    durations_file: str | Path | None = None,
    video_extensions: tuple[str, ...] = DEFAULT_EXTENSIONS,
    strict: bool = False,
    allow_absolute_video_paths: bool = False,
) -> tuple[list[dict], DataReport]:
    """Read, validate and normalise annotations. Video paths are resolved (and made absolute)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"annotation file {str(path)!r} does not exist")
    fmt = dataset_format or detect_format(path)
    if fmt not in READERS:
        raise AnnotationError(f"unknown dataset_format {fmt!r}; choose one of {FORMATS}")
    durations = read_durations_csv(durations_file) if durations_file else None
    root = Path(video_root).resolve() if video_root else path.resolve().parent
    report = DataReport()
    records, seen_videos, missing = [], set(), set()
    for where, query_id, video_key, duration, raw_spans, sentence in READERS[fmt](path, durations):
        try:
            duration = float(duration)
        except (TypeError, ValueError) as err:
            raise AnnotationError(f"{where}: duration {duration!r} is not a number") from err
        if not (math.isfinite(duration) and duration > 0):
            raise AnnotationError(f"{where}: duration must be > 0, got {duration}")
        raw = _as_spans(raw_spans, where)
        spans, clamped = [], False
        for start, end in raw:
            if duration < end <= duration + END_TOLERANCE_S:
                end = duration
            elif end > duration:
                if strict:
                    raise AnnotationError(
                        f"{where}: span [{start}, {end}] ends after the video ({duration} s)"
                    )
                end, clamped = duration, True
            if not 0 <= start < end:
                if strict:
                    raise AnnotationError(f"{where}: span {[start, end]} needs 0 <= start < end")
                spans = None
                break
            spans.append([start, end])
        if spans is None:
            report.invalid_spans.append(query_id)
            continue
        if clamped:
            report.clamped_spans.append(query_id)
        video = resolve_video(
            root, video_key, tuple(video_extensions), allow_absolute_video_paths, where
        ).resolve()
        if str(video) not in seen_videos:
            seen_videos.add(str(video))
            if not video.is_file():
                if strict:
                    raise AnnotationError(f"{where}: video {video} does not exist")
                missing.add(str(video))
        single = len(raw) == 1 and fmt != "qvhighlights"
        records.append(
            {
                "id": query_id,
                "video": str(video),
                "duration": duration,
                "solution": spans[0] if single else spans,
                "solution_raw": raw[0] if single else raw,
                "sentence": str(sentence).strip(),
            }
        )
    report.records, report.videos = len(records), len(seen_videos)
    report.missing_videos = sorted(missing)
    return records, report
