"""Annotation formats for temporal grounding, read into one record shape, with a stated validation policy.

Record shape (what :mod:`video_grpo.data.dataset` builds datasets from)::

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
- ``timelens_100k``, ``timelens_bench``, ``timelens2_93k``: the TimeLens family (TimeLens-100K, TimeLens-Bench,
  TimeLens2-93K's raw annotations), read by :mod:`video_grpo.data.timelens_annotations`. TimeLens2-93K has no
  durations: without ``durations_file`` each video's length is read from the video (frames / average fps).

Span shape: ``solution`` is ``[s, e]`` when every query of the file has one span; when any has several (or the
file is QVHighlights), every query's is a list of spans, ``[[s, e]]`` for one, since a dataset column holds one type.

Policy, counted in :class:`DataReport`: a span with start >= end is skipped; an end past the video's
duration (by more than 5 ms of float noise) is clamped to it (a start past it makes the span invalid); a missing video is listed. With
``strict=True`` each of these raises :class:`AnnotationError` instead.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from video_grpo.data.annotation_files import (
    AnnotationError,
    iter_jsonl_objects,
    need_fields,
    read_json_object,
    read_jsonl_lines,
    read_per_video_json,
    write_jsonl,
)
from video_grpo.data.annotation_files import as_spans as _as_spans
from video_grpo.data.timelens_annotations import (
    read_timelens2_93k,
    read_timelens_100k,
    read_timelens_bench,
    timelens_query,
)

__all__ = [
    "AnnotationError",
    "iter_jsonl_objects",
    "timelens_query",
    "write_jsonl",
]  # re-exported: older imports

# Ends within this much of the duration are float noise (ActivityNet stores 113.25999999999999 beside 113.26):
# they are set to the duration without being counted as clamped.
END_TOLERANCE_S = 0.005
FORMATS = (
    "jsonl",
    "charades_txt",
    "grounding_json",
    "qvhighlights",
    "timelens_100k",
    "timelens_bench",
    "timelens2_93k",
)
DEFAULT_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi", ".mov")


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


def _read_canonical(path: Path, durations: dict | None):
    for where, record in read_jsonl_lines(path):
        need_fields(record, ("id", "video", "duration", "solution", "sentence"), where)
        yield (
            where,
            str(record["id"]),
            str(record["video"]),
            record["duration"],
            record["solution"],
            record["sentence"],
        )


def _read_qvhighlights(path: Path, durations: dict | None):
    for where, record in read_jsonl_lines(path):
        need_fields(record, ("qid", "query", "duration", "vid", "relevant_windows"), where)
        yield (
            where,
            str(record["qid"]),
            str(record["vid"]),
            record["duration"],
            record["relevant_windows"],
            record["query"],
        )


def _read_grounding_json(path: Path, durations: dict | None):
    yield from read_per_video_json(path, "timestamps", "sentences")


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
    "timelens_100k": read_timelens_100k,
    "timelens_bench": read_timelens_bench,
    "timelens2_93k": read_timelens2_93k,
}


def detect_format(path: str | Path) -> str:
    """Guess the format from the extension and, for JSON lines, the first record's keys."""
    path = Path(path)
    if path.suffix == ".txt":
        return "charades_txt"
    if path.suffix == ".json":
        data = read_json_object(path, "{video_id: {...}}")
        first = next(iter(data.values()), None)
        return "timelens_bench" if isinstance(first, dict) and "queries" in first else "grounding_json"
    if path.suffix == ".jsonl":
        for _, record in read_jsonl_lines(path):
            if "relevant_windows" in record:
                return "qvhighlights"
            if "video_id" in record and "annotations" in record:
                return "timelens2_93k"
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


def length_from_video(video: Path, spans: list[list[float]], lengths: dict[Path, float | None]) -> float:
    """A video's length when the annotations carry none (TimeLens2-93K): frames / average fps, as TimeLens2's own
    converter computes it (grpo/tools/prepare_timelens2_93k.py). ``lengths`` caches it per video over a file.

    A missing or unreadable video cannot train, and ``data check`` lists it; its queries still count, with the
    latest annotated end as their duration (so no span of theirs is clamped)."""
    if video not in lengths:
        from video_grpo.data.video import VideoReadError, probe_video

        try:
            header = probe_video(str(video))
            lengths[video] = header["total_num_frames"] / header["fps"]
        except VideoReadError:
            lengths[video] = None
    known = lengths[video]
    return known if known is not None else max([end for _, end in spans] + [END_TOLERANCE_S])


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
    lengths: dict[Path, float | None] = {}
    for where, query_id, video_key, duration, raw_spans, sentence in READERS[fmt](path, durations):
        if duration is None:  # timelens2_93k without durations_file
            video = resolve_video(root, video_key, tuple(video_extensions), allow_absolute_video_paths, where)
            duration = length_from_video(video.resolve(), _as_spans(raw_spans, where), lengths)
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
        records.append(
            {
                "id": query_id,
                "video": str(video),
                "duration": duration,
                "solution": spans,
                "solution_raw": raw,
                "sentence": str(sentence).strip(),
            }
        )
    # One shape per file, as a dataset column holds one type: [s, e] when every query has one span, else every
    # solution a list of spans (QVHighlights always).
    if fmt != "qvhighlights" and all(len(r["solution_raw"]) == 1 for r in records):
        for record in records:
            record["solution"], record["solution_raw"] = record["solution"][0], record["solution_raw"][0]
    report.records, report.videos = len(records), len(seen_videos)
    report.missing_videos = sorted(missing)
    return records, report
