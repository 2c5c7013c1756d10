"""How one answer is scored against its true span(s): the span scorings of ``evaluate`` and ``curate``.

A module of its own, below both :mod:`video_grpo.evaluate` and :mod:`video_grpo.configs`: a recipe's
``span_scoring`` is checked against :data:`SPAN_SCORINGS` when it is parsed, and evaluate reads recipes, so the
names cannot live in evaluate without an import cycle. :mod:`video_grpo.evaluate` re-exports everything here.

- ``best_window``: the last span of the last ``<answer>`` block (else of the whole text); S > E is a parse
  failure; with several true windows, the best IoU over them.
- ``set``: every predicted span, merged, against every true span (TimeLens2's multi-span IoU), the answer read by
  the recipe's reader (``reader``): ``ours`` (the last ``<answer>`` block or the whole text, ``S to E`` or JSON;
  both sets merged) or ``timelens2`` (TimeLens2's reading and ``tiou``: :mod:`video_grpo.rewards.readers`), so that
  evaluation and curation (and so the draw weights) read an answer as the recipe's training reward does.
- ``timelens``: TimeLens's and TimeLens2's VLMEvalKit scoring (TencentARC/TimeLens ``evaluation/
  compute_metrics.py`` + ``timelens/utils.py``; MCG-NJU/TimeLens2 ``evaluation/vlmeval/dataset/timelens.py`` at
  2eb53e2, ``TimeLensBase.evaluate``): the whole output is read by their ``extract_time``
  (:func:`video_grpo.rewards.readers.timelens_pairs`), the *first* pair is scored against the first true span by their
  ``iou`` (:func:`video_grpo.rewards.readers.plain_iou`), unswapped: a reversed pair scores 0 but is not a parse
  failure; an output with no pair scores 0 and is one.
"""

from __future__ import annotations

from video_grpo.rewards.answers import (
    answer_block,
    completion_text,
    parse_answer_spans,
    parse_span_in,
    solution_spans,
)
from video_grpo.rewards.functions import temporal_iou
from video_grpo.rewards.readers import plain_iou, timelens2_set_iou, timelens2_spans, timelens_pairs
from video_grpo.rewards.span_sets import union_iou

SPAN_SCORINGS = ("best_window", "set", "timelens")
SET_READERS = ("ours", "timelens2")  # how ``set`` reads an answer: video_grpo.rewards.functions.recipe_reader
SPAN_SCORING_HELP = (
    "best_window: the last predicted span, best IoU over the true windows; set: TimeLens2's multi-span IoU of all "
    "predicted spans, merged, with all true spans; timelens: TimeLens's and TimeLens2's VLMEvalKit scoring (the "
    "first pair of TimeLens's extract_time over the whole output, plain IoU with the first true span, unswapped)"
)

Span = tuple[float, float]


def check_span_scoring(span_scoring: str, reader: str = "ours") -> None:
    if span_scoring not in SPAN_SCORINGS:
        raise ValueError(f"span_scoring {span_scoring!r} is not one of {list(SPAN_SCORINGS)}")
    if reader not in SET_READERS:
        raise ValueError(
            f"reader {reader!r} is not one of {list(SET_READERS)} (how span_scoring set reads an answer)"
        )


def parse_prediction(output: str | None) -> Span | None:
    """Span from the last ``<answer>`` block, else the last ``S to E`` anywhere; None on failure."""
    if not output:
        return None
    text = completion_text(output)
    block = answer_block(text)
    return parse_span_in(block if block is not None else text)


def query_iou(span: Span | None, solution) -> float:
    if span is None:
        return 0.0
    windows = solution if isinstance(solution[0], list | tuple) else [solution]
    return max(temporal_iou(span, (float(s), float(e))) for s, e in windows)


def parse_prediction_spans(output: str | None, reader: str = "ours") -> list[Span] | None:
    """Every span of an answer as ``reader`` reads it (ours: the last ``<answer>`` block, else the whole text);
    None on failure."""
    if not output:
        return None
    if reader == "timelens2":
        return timelens2_spans(completion_text(output))
    return parse_answer_spans(output)


def set_iou(spans: list[Span] | None, solution, reader: str = "ours") -> float:
    """The multi-span IoU of the predicted span set with the true one(s); 0 on a parse failure. ``ours`` merges
    both sets; ``timelens2`` is their ``tiou`` (true spans as annotated)."""
    if spans is None:
        return 0.0
    if reader == "timelens2":
        return timelens2_set_iou(spans, solution_spans(solution))
    return union_iou(spans, solution_spans(solution))


def timelens_prediction(output: str | None) -> Span | None:
    """The pair TimeLens's evaluation scores: the first pair its ``extract_time`` finds in the whole output, as
    written (a reversed pair stays reversed); None when it finds none."""
    pairs = timelens_pairs(completion_text(output)) if output else []
    return pairs[0] if pairs else None


def timelens_iou(span: Span | None, solution) -> float:
    """Their ``iou`` of the pair with the first true span (a nested solution's first window); 0 for no pair."""
    return 0.0 if span is None else plain_iou(span, solution_spans(solution)[0])


def scored_span(output: str | None, span_scoring: str = "best_window", reader: str = "ours") -> list | None:
    """What ``span_scoring`` read from an answer, for a prediction record's ``span``: ``[S, E]`` (for ``set``,
    every span read, ``[[S, E], ...]``), or None when it read nothing."""
    check_span_scoring(span_scoring, reader)
    if span_scoring == "set":
        spans = parse_prediction_spans(output, reader)
        return [list(span) for span in spans] if spans else None
    span = timelens_prediction(output) if span_scoring == "timelens" else parse_prediction(output)
    return list(span) if span else None


def score_output(
    output: str | None, solution, span_scoring: str = "best_window", reader: str = "ours"
) -> tuple[float, bool]:
    """``(IoU, parsed)`` of one answer under ``span_scoring`` (see the module docstring); ``reader`` is how
    ``set`` reads the answer."""
    check_span_scoring(span_scoring, reader)
    if span_scoring == "set":
        spans = parse_prediction_spans(output, reader)
        return set_iou(spans, solution, reader), spans is not None
    if span_scoring == "timelens":
        span = timelens_prediction(output)
        return timelens_iou(span, solution), span is not None
    span = parse_prediction(output)
    return query_iou(span, solution), span is not None
