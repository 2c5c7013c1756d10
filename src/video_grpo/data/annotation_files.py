"""Reading annotation files: JSON and JSON-lines with errors that name the file, the line and the field.

The primitives every reader in :mod:`video_grpo.data.annotations` and :mod:`video_grpo.data.timelens_annotations` shares,
kept apart so that both can use them without importing each other.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


class AnnotationError(ValueError):
    """Malformed or (in strict mode) policy-violating annotations. The message names the file and line."""


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


def read_jsonl_lines(path: Path):
    """``("file:line", object)`` for each record of a JSON-lines file."""
    for _, where, record in iter_jsonl_objects(path):
        yield where, record


def need_fields(record: dict, keys: tuple[str, ...], where: str) -> None:
    """An :class:`AnnotationError` naming ``where`` and the missing keys, unless ``record`` has every key."""
    missing = [k for k in keys if k not in record]
    if missing:
        raise AnnotationError(f"{where}: missing field(s) {missing}; each record needs {list(keys)}")


def read_json_object(path: Path, shape: str) -> dict:
    """A whole-file JSON object; ``shape`` describes what was expected, for the error."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise AnnotationError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
    if not isinstance(data, dict):
        raise AnnotationError(f"{path}: expected {shape}, got a JSON {type(data).__name__}")
    return data


def read_per_video_json(path: Path, span_key: str, sentence_key: str):
    """``{vid: {duration, <span_key>, <sentence_key>}}``: the grounding_json and timelens_bench layouts."""
    data = read_json_object(path, f"{{video_id: {{duration, {span_key}, {sentence_key}}}}}")
    for vid, entry in data.items():
        where = f"{path}: video {vid}"
        if not isinstance(entry, dict):
            raise AnnotationError(f"{where}: expected an object with duration, {span_key}, {sentence_key}")
        need_fields(entry, ("duration", span_key, sentence_key), where)
        spans, sentences = entry[span_key], entry[sentence_key]
        if not isinstance(spans, list) or not isinstance(sentences, list) or len(spans) != len(sentences):
            raise AnnotationError(
                f"{where}: {span_key} and {sentence_key} must be lists of one length, got "
                f"{len(spans) if isinstance(spans, list) else spans!r} and "
                f"{len(sentences) if isinstance(sentences, list) else sentences!r}"
            )
        for index, (span, sentence) in enumerate(zip(spans, sentences, strict=True)):
            yield f"{where} #{index}", f"{vid}_{index}", vid, entry["duration"], span, sentence


def as_spans(raw, where: str) -> list[list[float]]:
    """Annotated span(s) as a list of [start, end] floats: one ``[s, e]`` or a list of them."""
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
