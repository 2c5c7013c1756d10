"""Reward functions for temporal grounding, and the registry the YAML names them from.

Every reward follows TRL's calling convention: ``f(prompts=, completions=, completion_ids=, **columns)``
where each dataset column (``solution``, ``duration``, ...) arrives as a per-sample list and completions are
either strings or conversational ``[{"role": "assistant", "content": ...}]`` lists. They never raise on
model output and always return one float per completion.

Answer parsing (:func:`parse_span`, shared with evaluation):

- only the *last* ``<answer>...</answer>`` block counts;
- inside it, the *last* ``S to E`` is read; ``from S to E`` and ``S - E`` read the same;
- S and E are seconds (``12``, ``12.5``, optionally followed by ``s``/``sec``/``secs``/``seconds``) or clock
  times ``mm:ss`` / ``hh:mm:ss`` (seconds may have decimals);
- S > E, negative values, NaN/inf and values above 10^6 s are unparsable and score 0;
- for rewards the span is then clipped to ``[0, duration]`` when the duration is known.

Answer-only answers (``iou_answer_only``, TimeLens, arXiv 2512.14698): the completion is one sentence,
``The event happens in S - E seconds.``, with no ``<think>`` or ``<answer>`` tags. :func:`parse_answer_only`
reads the last ``S - E`` (or ``S to E``) anywhere in it; an ``<answer>`` block, if the model writes one anyway,
wins, exactly as :func:`video_grpo.evaluate.parse_prediction` scores it, so training and evaluation read an
answer the same way. The reward is that span's IoU alone: TimeLens trains with no format term.

Multi-span answers (``multi_span_iou``): every ``S to E`` in the last answer block, separated by ``;`` or
``,``, is a predicted span. Predicted and true spans are each merged into a union of intervals, and the
reward is |pred ∩ true| / |pred ∪ true| measured in seconds. Overlapping predictions therefore cannot
earn double credit, and one long span covering every true window is penalised by the union.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import re
from collections.abc import Callable

MAX_SECONDS = 1e6
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# Bounded digit runs keep matching linear and reject absurd magnitudes early.
_TIME = r"(?:\d{1,7}(?::\d{1,2}){0,2}(?:\.\d{1,6})?)"
_UNIT = r"(?:\s*(?:seconds|second|secs|sec|s)\b)?"
_SPAN_RE = re.compile(
    rf"(?<![\d.:\-])({_TIME}){_UNIT}\s*(?:to|-|–)\s*({_TIME}){_UNIT}(?![\d:])", re.IGNORECASE
)
_FORMAT_RE = re.compile(
    r"\A\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>((?:(?!</?think>|</?answer>).)*)</answer>\s*\Z",
    re.DOTALL,
)


# The answer written from an annotated span: the SFT target (video_grpo.sft) and the ground-truth-guided answer of
# TempSamp-style groups. It passes the strict `format` reward and parse_span reads its span back.
DEFAULT_ANSWER_TEMPLATE = (
    "<think>The event is visible from {start} to {end} seconds.</think><answer>{start} to {end}</answer>"
)


# TimeLens's answer sentence (training/data/grounding.py ``_format_response`` in TencentARC/TimeLens writes spans
# with one decimal, our ANSWER_DECIMALS): the answer-only SFT target, and what the answer-only prompt asks for.
ANSWER_ONLY_TEMPLATE = "The event happens in {start} - {end} seconds."


def render_answer(template: str, start: float, end: float, sentence: str = "", decimals: int = 1) -> str:
    """``template`` with ``{start}``/``{end}`` (seconds, ``decimals`` places) and ``{sentence}`` filled in.

    The SFT target and gt_guidance's guided answer both use ``configs.ANSWER_DECIMALS`` (1), so a guided answer
    is written the way the policy writes its own answers."""
    return template.format(
        start=f"{float(start):.{decimals}f}", end=f"{float(end):.{decimals}f}", sentence=sentence
    )


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


def parse_span_in(text: str) -> tuple[float, float] | None:
    """The last well-formed ``S to E`` span anywhere in ``text``."""
    matches = _SPAN_RE.findall(text)
    if not matches:
        return None
    start, end = (_to_seconds(t) for t in matches[-1])
    if start is None or end is None:
        return None
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end > MAX_SECONDS or start > end:
        return None
    return start, end


def parse_spans_in(text: str) -> list[tuple[float, float]] | None:
    """Every ``S to E`` span in ``text``; None if any is invalid or there is none."""
    spans = []
    for start_token, end_token in _SPAN_RE.findall(text):
        start, end = _to_seconds(start_token), _to_seconds(end_token)
        if start is None or end is None or start < 0 or end > MAX_SECONDS or start > end:
            return None
        spans.append((start, end))
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


def temporal_iou(pred: tuple[float, float], gt: tuple[float, float]) -> float:
    """IoU of two [start, end] spans; 0 when the union is empty."""
    inter = max(0.0, min(pred[1], gt[1]) - max(pred[0], gt[0]))
    union = max(pred[1], gt[1]) - min(pred[0], gt[0])
    return inter / union if union > 0 else 0.0


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def union_iou(pred: list[tuple[float, float]], gt: list[tuple[float, float]]) -> float:
    """IoU of two sets of spans, each taken as the union of its intervals (time measure, in seconds)."""
    pred, gt = _merge(pred), _merge(gt)
    inter = sum(max(0.0, min(b, d) - max(a, c)) for a, b in pred for c, d in gt)
    union = sum(b - a for a, b in pred) + sum(d - c for c, d in gt) - inter
    return inter / union if union > 0 else 0.0


def _clip(span: tuple[float, float], duration: float | None) -> tuple[float, float]:
    if duration is None or not duration > 0:
        return span
    return min(max(span[0], 0.0), duration), min(max(span[1], 0.0), duration)


def _column(kwargs: dict, name: str, n: int) -> list:
    values = kwargs.get(name)
    return list(values) if values is not None else [None] * n


def _span_iou_rewards(
    parse: Callable[[object], tuple[float, float] | None], completions: list, solution: list, kwargs: dict
) -> list[float]:
    """Temporal IoU of each completion's span, read by ``parse`` and clipped to the video, with ``solution``; 0
    when ``parse`` finds no span."""
    durations = _column(kwargs, "duration", len(completions))
    rewards = []
    for completion, gt, duration in zip(completions, solution, durations, strict=True):
        span = parse(completion)
        rewards.append(
            0.0 if span is None else temporal_iou(_clip(span, duration), (float(gt[0]), float(gt[1])))
        )
    return rewards


def iou_reward(completions: list, solution: list, **kwargs) -> list[float]:
    """Temporal IoU of the answered span (clipped to the video) with ``solution``; 0 if unparsable."""
    return _span_iou_rewards(parse_span, completions, solution, kwargs)


def iou_answer_only_reward(completions: list, solution: list, **kwargs) -> list[float]:
    """TimeLens's reward: temporal IoU of the answer-only span (:func:`parse_answer_only`), clipped to the video,
    with ``solution``; 0 if no span. No tags are needed, so pair it with no ``format`` reward."""
    return _span_iou_rewards(parse_answer_only, completions, solution, kwargs)


def iou_dist_reward(completions: list, solution: list, **kwargs) -> list[float]:
    """IoU x (1 - |dS|/D) x (1 - |dE|/D): sharper credit near the true boundaries; 0 when IoU is 0.

    D is the video duration (falls back to the larger span end when unknown)."""
    durations = _column(kwargs, "duration", len(completions))
    rewards = []
    for completion, gt, duration in zip(completions, solution, durations, strict=True):
        span = parse_span(completion)
        if span is None:
            rewards.append(0.0)
            continue
        start, end = _clip(span, duration)
        gs, ge = float(gt[0]), float(gt[1])
        d = float(duration) if duration and duration > 0 else max(end, ge, 1e-6)
        iou = temporal_iou((start, end), (gs, ge))
        rewards.append(iou * max(0.0, 1 - abs(start - gs) / d) * max(0.0, 1 - abs(end - ge) / d))
    return rewards


def multi_span_iou_reward(completions: list, solution: list, **kwargs) -> list[float]:
    """Union IoU of all answered spans with all true spans (QVHighlights-style ``relevant_windows``).

    ``solution`` may be one ``[start, end]`` or a list of them."""
    durations = _column(kwargs, "duration", len(completions))
    rewards = []
    for completion, gt, duration in zip(completions, solution, durations, strict=True):
        block = answer_block(completion_text(completion))
        spans = parse_spans_in(block) if block is not None else None
        if not spans:
            rewards.append(0.0)
            continue
        truth = (
            [tuple(map(float, gt))]
            if not isinstance(gt[0], list | tuple)
            else [tuple(map(float, w)) for w in gt]
        )
        rewards.append(union_iou([_clip(sp, duration) for sp in spans], truth))
    return rewards


def length_penalty_reward(completions: list, max_think_words: int = 256, **kwargs) -> list[float]:
    """0 for a ``<think>`` block of at most ``max_think_words`` words, falling linearly to -1 at twice that.

    Counts whitespace-separated words, so it needs no tokenizer. Set the limit from the YAML with
    ``reward_kwargs: {length_penalty: {max_think_words: 128}}``."""
    rewards = []
    for completion in completions:
        text = completion_text(completion)
        start, end = text.find("<think>"), text.find("</think>")
        body = text[start + 7 : end] if 0 <= start < end else (text[start + 7 :] if start >= 0 else "")
        words = len(body.split())
        rewards.append(0.0 - min(1.0, max(0.0, words - max_think_words) / max(max_think_words, 1)))
    return rewards


def format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 for exactly ``<think>...</think><answer>S to E</answer>`` (whitespace allowed), else 0."""
    rewards = []
    for completion in completions:
        match = _FORMAT_RE.match(completion_text(completion))
        rewards.append(1.0 if match and parse_span_in(match.group(1)) is not None else 0.0)
    return rewards


def format_soft_reward(completions: list, **kwargs) -> list[float]:
    """Graded format credit in [0, 1]: a quarter each for a ``<think>`` block, an ``<answer>`` block, the two in
    that order, and a parsable span in the answer. Gives a signal before the policy emits the full format."""
    rewards = []
    for completion in completions:
        text = completion_text(completion)
        think_open, think_close = text.find("<think>"), text.find("</think>")
        has_think = 0 <= think_open < think_close
        block = answer_block(text)
        has_answer = block is not None
        in_order = has_think and has_answer and think_close < text.rfind(ANSWER_OPEN)
        parsable = has_answer and parse_span_in(block) is not None
        rewards.append(0.25 * (has_think + has_answer + in_order + parsable))
    return rewards


REWARD_FUNCS: dict[str, Callable[..., list[float]]] = {
    "iou": iou_reward,
    "iou_answer_only": iou_answer_only_reward,
    "format": format_reward,
    "format_soft": format_soft_reward,
    "iou_dist": iou_dist_reward,
    "multi_span_iou": multi_span_iou_reward,
    "length_penalty": length_penalty_reward,
}


def bind_params(func: Callable, params: dict) -> Callable:
    """``func`` with keyword parameters fixed, keeping its ``__name__`` (TRL logs rewards under it)."""
    if not params:
        return func
    accepted = [
        p.name
        for p in inspect.signature(func).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in ("completions", "prompts", "completion_ids")
    ]
    for key in params:
        if key not in accepted:
            raise ValueError(f"reward {func.__name__!r} has no parameter {key!r}; its parameters: {accepted}")
    bound = functools.partial(func, **params)
    return functools.update_wrapper(bound, func)


def resolve_reward_funcs(names: list[str], params: dict[str, dict] | None = None) -> list[Callable]:
    """Map registry names or ``package.module:function`` paths to callables, with parameters from ``params``
    (keyed by the same name) bound as keyword arguments.

    Raises ValueError naming the bad entry and listing the known names, so a typo fails before the model loads.
    """
    params = params or {}
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(f"reward_kwargs names {unknown}, which are not in reward_funcs {names}")
    funcs = []
    for name in names:
        if name in REWARD_FUNCS:
            funcs.append(bind_params(REWARD_FUNCS[name], params.get(name) or {}))
            continue
        if ":" not in name:
            raise ValueError(
                f"unknown reward {name!r}. Known rewards: {', '.join(sorted(REWARD_FUNCS))}; "
                "or give a plug-in as 'package.module:function'."
            )
        module_name, _, attr = name.partition(":")
        try:
            func = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(
                f"cannot load reward plug-in {name!r}: {err}. Known rewards: {', '.join(sorted(REWARD_FUNCS))}."
            ) from err
        if not callable(func):
            raise ValueError(f"reward plug-in {name!r} is not callable")
        funcs.append(bind_params(func, params.get(name) or {}))
    return funcs
