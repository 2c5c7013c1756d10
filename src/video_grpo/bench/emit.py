"""The benchmarks' one JSON-line writer: ``{"name", "ours", "baseline", "ratio", "unit", ...}`` per measurement.

At the bottom of :mod:`video_grpo.bench`: every benchmark (and ``scripts/bench_gpu.py``) writes through it, and it
imports none of them."""

from __future__ import annotations

import json
import sys

emit_stream = None  # where JSON lines go; stdout, even while trainer output is redirected
DIGITS = 6  # a microsecond, a millionth of a MB or of a ratio: finer digits are noise


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, DIGITS)


def row(name: str, ours: float | None, baseline: float | None, unit: str, **extra) -> dict:
    """One measurement as the JSON line's dict. A side that could not be measured is ``None`` (e.g. a kernel this
    device lacks); the ratio is then ``None``, as it is for a zero baseline."""
    return {
        "name": name,
        "ours": _rounded(ours),
        "baseline": _rounded(baseline),
        "ratio": _rounded(ours / baseline) if ours is not None and baseline else None,
        "unit": unit,
        **extra,
    }


def emit_row(line: dict) -> dict:
    """Print a :func:`row` (one made in another process, say) as a JSON line and return it."""
    print(json.dumps(line), file=emit_stream or sys.stdout, flush=True)
    return line


def emit(name: str, ours: float | None, baseline: float | None, unit: str, **extra) -> dict:
    """Print one measurement (:func:`row`) as a JSON line and return it."""
    return emit_row(row(name, ours, baseline, unit, **extra))
