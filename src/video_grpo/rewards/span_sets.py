"""Sets of time spans: merging, overlap scores, and the temporal Wasserstein reward's distance.

A span set is a list of ``(start, end)`` pairs in seconds, ``start <= end``. It stands for the union of its
intervals, so overlapping or touching spans are merged before anything is measured: a set reads the same
however it is cut into pieces.

``twass_score`` (TimeLens2, MCG-NJU/TimeLens2 at f07353b, ``grpo/timelens/rewards/metrics.py``): R =
exp(-beta * W1 / L), where W1 is the 1-D Wasserstein-1 distance between the uniform distributions on the two merged
sets and L is the measure of the merged true set (their earlier release, ``normalizer="union"``: of the union of
both sets, which a broad answer enlarges, so it lost little). IoU is 0 for every miss; W1 keeps growing with the
distance of a miss, so answers that miss the truth by different amounts still get different rewards. W1 and L both
scale with time, so R is unchanged by a common shift or stretch of all times.

W1 is computed exactly, from the quantile functions: for distributions on the line,
W1 = integral over u in [0, 1] of |Q_p(u) - Q_t(u)| du, and the quantile function of a uniform distribution on
disjoint intervals is piecewise linear in u, so the integral is a sum of integrals of |linear| pieces.

Zero-length spans: a point has no length, so beside spans of positive length it carries no mass and is
ignored. A set whose spans all have zero length is taken as the limit of ever shorter spans: equal mass on
each distinct point. This keeps R continuous in the endpoints (a 0.01 s span and a point at the same place
score alike). L then measures only the positive-length parts; when the normalising set has zero length, L = 0
and R is 1 when W1 is 0 and 0 otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

Span = tuple[float, float]


def merge_spans(spans: Iterable[Sequence[float]]) -> list[Span]:
    """Sorted, disjoint spans covering the same time as ``spans``; overlapping or touching ones are joined."""
    merged: list[list[float]] = []
    for start, end in sorted((float(s), float(e)) for s, e in spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def total_length(spans: Iterable[Sequence[float]]) -> float:
    """Measure of the union of ``spans`` in seconds (overlaps counted once)."""
    return sum(end - start for start, end in merge_spans(spans))


def overlap_length(pred: Sequence[Span], truth: Sequence[Span]) -> float:
    """Sum of the pairwise overlaps of two span lists (each overlap counted once if both lists are merged)."""
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in pred for c, d in truth)


def union_iou(pred: Sequence[Sequence[float]], truth: Sequence[Sequence[float]]) -> float:
    """|pred ∩ truth| / |pred ∪ truth| of two span sets, each merged first (seconds); 0 when the union is empty.

    This is TimeLens2's evaluation of multi-span answers (merge the predicted spans, divide the sum of overlaps
    by the union); they leave the true spans unmerged, which differs only if true spans overlap each other."""
    pred_m, truth_m = merge_spans(pred), merge_spans(truth)
    inter = overlap_length(pred_m, truth_m)
    union = sum(b - a for a, b in pred_m) + sum(d - c for c, d in truth_m) - inter
    return inter / union if union > 0 else 0.0


def _check(spans: Sequence[Sequence[float]], name: str) -> list[Span]:
    out = []
    for span in spans:
        start, end = float(span[0]), float(span[1])
        if not (math.isfinite(start) and math.isfinite(end)) or start > end:
            raise ValueError(f"{name}: span {list(span)} is not a finite [start, end] with start <= end")
        out.append((start, end))
    return out


def _pieces(spans: list[Span]) -> list[tuple[float, float, float]]:
    """``(start, end, mass)`` pieces of the uniform distribution on ``spans`` (see the module docstring)."""
    merged = merge_spans(spans)
    positive = [(a, b) for a, b in merged if b > a]
    if positive:
        length = sum(b - a for a, b in positive)
        return [(a, b, (b - a) / length) for a, b in positive]
    points = sorted({a for a, _ in merged})
    return [(p, p, 1.0 / len(points)) for p in points]


def wasserstein1(pred: Sequence[Sequence[float]], truth: Sequence[Sequence[float]]) -> float:
    """Exact W1 distance (seconds) between the uniform distributions on two non-empty span sets."""
    pred_pieces, truth_pieces = _pieces(_check(pred, "pred")), _pieces(_check(truth, "truth"))
    if not pred_pieces or not truth_pieces:
        raise ValueError("wasserstein1 needs two non-empty span sets")

    def cumulative(pieces: list[tuple[float, float, float]]) -> list[float]:
        edges = [0.0]
        for _, _, mass in pieces:
            edges.append(min(1.0, edges[-1] + mass))  # rounding must not push an edge past 1 ...
        edges[-1] = 1.0  # ... nor leave a sliver of u uncovered
        return edges

    edges_p, edges_t = cumulative(pred_pieces), cumulative(truth_pieces)
    cuts = sorted(set(edges_p) | set(edges_t))

    def quantile(pieces, edges, k: int, u: float) -> float:
        start, end, mass = pieces[k]
        return start + (end - start) * (u - edges[k]) / mass

    total, i, j = 0.0, 0, 0
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        if hi <= lo:
            continue
        while edges_p[i + 1] <= lo:
            i += 1
        while edges_t[j + 1] <= lo:
            j += 1
        d0 = quantile(pred_pieces, edges_p, i, lo) - quantile(truth_pieces, edges_t, j, lo)
        d1 = quantile(pred_pieces, edges_p, i, hi) - quantile(truth_pieces, edges_t, j, hi)
        if d0 * d1 >= 0:
            total += 0.5 * (abs(d0) + abs(d1)) * (hi - lo)
        else:  # the difference crosses zero inside: two triangles
            total += 0.5 * (d0 * d0 + d1 * d1) / (abs(d0) + abs(d1)) * (hi - lo)
    return total


NORMALIZERS = ("truth", "union")


def twass_score(
    pred_spans: Sequence[Sequence[float]],
    true_spans: Sequence[Sequence[float]],
    beta: float = 1.0,
    normalizer: str = "truth",
) -> float:
    """TimeLens2's temporal Wasserstein reward exp(-beta * W1 / L) of two span sets; 0 if either is empty.

    ``normalizer``: L is the length of the merged true set (``truth``, TimeLens2's since f07353b) or of the union
    of both sets (``union``, their earlier release). In (0, 1] for non-empty sets of positive length, 1 exactly
    when the merged sets cover the same time."""
    if not beta > 0 or not math.isfinite(beta):
        raise ValueError(
            f"twass: beta must be a positive number, got {beta!r} (set reward_kwargs: {{twass: {{beta: 1.0}}}})"
        )
    if normalizer not in NORMALIZERS:
        raise ValueError(f"twass: normalizer must be one of {list(NORMALIZERS)}, got {normalizer!r}")
    pred, truth = _check(pred_spans, "pred"), _check(true_spans, "truth")
    if not pred or not truth:
        return 0.0
    w1 = wasserstein1(pred, truth)
    length = total_length(truth) if normalizer == "truth" else total_length(pred + truth)
    if length <= 0:  # the normalising set is points only
        return 1.0 if w1 == 0 else 0.0
    return math.exp(-beta * w1 / length)
