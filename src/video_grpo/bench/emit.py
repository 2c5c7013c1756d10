"""The benchmarks' one JSON-line writer: ``{"name", "ours", "baseline", "ratio", "unit", ...}`` per measurement.

At the bottom of :mod:`video_grpo.bench`: every benchmark module imports it, and it imports none of them."""

from __future__ import annotations

import json
import sys

emit_stream = None  # where JSON lines go; stdout, even while trainer output is redirected


def emit(name: str, ours: float, baseline: float, unit: str, **extra) -> dict:
    line = {
        "name": name,
        "ours": round(ours, 6),
        "baseline": round(baseline, 6),
        "ratio": round(ours / baseline, 6) if baseline else None,
        "unit": unit,
        **extra,
    }
    print(json.dumps(line), file=emit_stream or sys.stdout, flush=True)
    return line
