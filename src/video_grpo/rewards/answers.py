"""Reading spans out of model answers, and writing answers from annotated spans.

Shared by the rewards (:mod:`video_grpo.rewards.functions`), evaluation (:mod:`video_grpo.evaluate`), the SFT target
(:mod:`video_grpo.sft`) and ground-truth-guided answers (:mod:`video_grpo.loss.guidance`), so that every part of the
recipe reads and writes an answer the same way.

Two span forms are read, alone or mixed:

- ours, ``S to E``: ``from S to E`` and ``S - E`` read the same; S and E are seconds (``12``, ``12.5``,
  optionally followed by ``s``/``sec``/``secs``/``seconds``) or clock times ``mm:ss`` / ``hh:mm:ss`` (seconds
  may have decimals);
- TimeLens2's JSON form, ``[[S, E], [S, E], ...]`` (or one ``[S, E]``), with the same kinds of S and E.

Rules:

- only the *last* ``<answer>...</answer>`` block counts;
- a single-span reader (:func:`parse_span_in`) takes the *last* span in it, of either form;
- a multi-span reader (:func:`parse_spans_in`) takes every span, and fails if any of them is invalid;
- S > E, negative values, NaN/inf and values above 10^6 s are unparsable (TimeLens2 swaps a reversed pair; we
  refuse it, as we always have). S = E parses; it is a span of zero length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

MAX_SECONDS = 1e6

# Decimal places of {start}/{end} in every answer written from an annotation: the cold-start SFT target
# (video_grpo.sft) and the gt_guidance answer (video_grpo.loss.guidance). One value, so that the guided answer is
# written the way the cold start taught the policy to write.
ANSWER_DECIMALS = 1
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# Bounded digit runs keep matching linear and reject absurd magnitudes early.
_TIME = r"(?:\d{1,7}(?::\d{1,2}){0,2}(?:\.\d{1,6})?)"
_UNIT = r"(?:\s*(?:seconds|second|secs|sec|s)\b)?"
_SPAN_RE = re.compile(
    rf"(?<![\d.:\-])({_TIME}){_UNIT}\s*(?:to|-|–)\s*({_TIME}){_UNIT}(?![\d:])", re.IGNORECASE
)
# One ``[S, E]`` pair of the JSON form. A leading minus is matched so that a negative time is refused, not
# silently skipped.
_PAIR_RE = re.compile(rf"\[\s*(-?{_TIME}){_UNIT}\s*,\s*(-?{_TIME}){_UNIT}\s*\]", re.IGNORECASE)


# The answer written from an annotated span: the SFT target (video_grpo.sft) and the ground-truth-guided answer of
# TempSamp-style groups. It passes the strict `format` reward and parse_span reads its span back.
DEFAULT_ANSWER_TEMPLATE = (
    "<think>The event is visible from {start} to {end} seconds.</think><answer>{start} to {end}</answer>"
)

# The same answer with every annotated span, in TimeLens2's JSON form: the template for multi-span data.
JSON_ANSWER_TEMPLATE = "<think>The event is visible at {spans} seconds.</think><answer>{spans}</answer>"

# TimeLens's answer sentence (training/data/grounding.py ``_format_response`` in TencentARC/TimeLens writes spans
# with one decimal, our ANSWER_DECIMALS): the answer-only SFT target, and what the answer-only prompt asks for.
ANSWER_ONLY_TEMPLATE = "The event happens in {start} - {end} seconds."


def solution_spans(solution) -> list[tuple[float, float]]:
    """A ``solution`` column value, one ``[start, end]`` or a list of them, as a list of float pairs."""
    if len(solution) and isinstance(solution[0], list | tuple):
        return [(float(s), float(e)) for s, e in solution]
    return [(float(solution[0]), float(solution[1]))]


def render_answer(
    template: str,
    start: float,
    end: float,
    sentence: str = "",
    decimals: int = 1,
    spans: Sequence[Sequence[float]] | None = None,
) -> str:
    """``template`` with ``{start}``/``{end}`` (seconds, ``decimals`` places), ``{spans}`` (every span in
    TimeLens2's JSON form, ``[[S, E], ...]``; ``spans`` defaults to the one span ``(start, end)``) and
    ``{sentence}`` filled in.

    The SFT target and gt_guidance's guided answer both use ``ANSWER_DECIMALS`` (1), so a guided answer
    is written the way the policy writes its own answers."""
    spans = [(start, end)] if spans is None else spans
    pairs = ", ".join(f"[{float(s):.{decimals}f}, {float(e):.{decimals}f}]" for s, e in spans)
    return template.format(
        start=f"{float(start):.{decimals}f}",
        end=f"{float(end):.{decimals}f}",
        spans=f"[{pairs}]",
        sentence=sentence,
    )


def render_solution(template: str, solution, sentence: str = "", decimals: int = 1) -> str:
    """The answer ``template`` writes for a ``solution`` of one span or several.

    Several spans need ``{spans}``: ``{start}``/``{end}`` name one span, and writing only one of several
    would teach (or guide towards) an incomplete answer."""
    spans = solution_spans(solution)
    if len(spans) > 1 and ("{start}" in template or "{end}" in template):
        raise ValueError(
            f"answer_template {template!r} writes one span ({{start}}/{{end}}) but the solution has "
            f"{len(spans)}: {solution!r}. Use {{spans}} (all spans as [[S, E], ...]), e.g. "
            "video_grpo.rewards.answers.JSON_ANSWER_TEMPLATE."
        )
    return render_answer(template, spans[0][0], spans[-1][1], sentence, decimals=decimals, spans=spans)


def completion_text(completion) -> str:
    """The text of a string or conversational completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        content = completion[-1].get("content", "") if isinstance(completion[-1], dict) else ""
        if isinstance(content, list):  # content blocks
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return content if isinstance(content, str) else ""
    return ""


def answer_block(text: str) -> str | None:
    """Contents of the last ``<answer>...</answer>`` block, or None."""
    end = text.rfind(ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(ANSWER_OPEN) : end]


def _to_seconds(token: str) -> float | None:
    parts = token.split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return None
    if len(values) > 1 and any(v >= 60 for v in values[1:]):
        return None  # 1:75 is not a clock time
    seconds = 0.0
    for v in values:
        seconds = seconds * 60 + v
    return seconds


def _span_tokens(text: str) -> list[tuple[str, str]]:
    """The (S, E) tokens of every span in ``text``, of either form, in the order they are written."""
    found = [(m.start(), m.group(1), m.group(2)) for m in _SPAN_RE.finditer(text)]
    found += [(m.start(), m.group(1), m.group(2)) for m in _PAIR_RE.finditer(text)]
    return [(s, e) for _, s, e in sorted(found)]


def _valid_span(start_token: str, end_token: str) -> tuple[float, float] | None:
    if start_token.startswith("-") or end_token.startswith("-"):
        return None
    start, end = _to_seconds(start_token), _to_seconds(end_token)
    if start is None or end is None:
        return None
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end > MAX_SECONDS or start > end:
        return None
    return start, end


def parse_span_in(text: str) -> tuple[float, float] | None:
    """The last well-formed span, ``S to E`` or ``[S, E]``, anywhere in ``text``."""
    tokens = _span_tokens(text)
    return _valid_span(*tokens[-1]) if tokens else None


def parse_spans_in(text: str) -> list[tuple[float, float]] | None:
    """Every span in ``text``, of either form; None if any is invalid or there is none."""
    spans = []
    for start_token, end_token in _span_tokens(text):
        span = _valid_span(start_token, end_token)
        if span is None:
            return None
        spans.append(span)
    return spans or None


def parse_span(completion) -> tuple[float, float] | None:
    """The span in the last ``<answer>`` block of a completion, or None when there is none or it is invalid."""
    block = answer_block(completion_text(completion))
    return None if block is None else parse_span_in(block)


def parse_answer_only(completion) -> tuple[float, float] | None:
    """The span of an answer-only completion (``The event happens in S - E seconds.``): the last ``<answer>``
    block's span if there is a block, else the last span anywhere; None when there is none or it is invalid."""
    text = completion_text(completion)
    block = answer_block(text)
    return parse_span_in(block if block is not None else text)


def parse_answer_spans(completion) -> list[tuple[float, float]] | None:
    """Every span of a completion's answer: its last ``<answer>`` block if it has one, else the whole text (as
    TimeLens2 reads its untagged JSON answers, and as evaluation reads base models); None when there is no span
    or one is invalid."""
    text = completion_text(completion)
    block = answer_block(text)
    return parse_spans_in(block if block is not None else text)
