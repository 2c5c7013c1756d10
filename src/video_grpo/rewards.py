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
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable

MAX_SECONDS = 1e6
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# Bounded digit runs keep matching linear and reject absurd magnitudes early.
_TIME = r"(?:\d{1,7}(?::\d{1,2}){0,2}(?:\.\d{1,6})?)"
_UNIT = r"(?:\s*(?:seconds|second|secs|sec|s)\b)?"
_SPAN_RE = re.compile(rf"(?<![\d.:\-])({_TIME}){_UNIT}\s*(?:to|-|–)\s*({_TIME}){_UNIT}(?![\d:])", re.IGNORECASE)
_FORMAT_RE = re.compile(
    r"\A\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>((?:(?!</?think>|</?answer>).)*)</answer>\s*\Z",
    re.DOTALL,
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


def parse_span(completion) -> tuple[float, float] | None:
    """The span in the last ``<answer>`` block of a completion, or None when there is none or it is invalid."""
    block = answer_block(completion_text(completion))
    return None if block is None else parse_span_in(block)


def temporal_iou(pred: tuple[float, float], gt: tuple[float, float]) -> float:
    """IoU of two [start, end] spans; 0 when the union is empty."""
    inter = max(0.0, min(pred[1], gt[1]) - max(pred[0], gt[0]))
    union = max(pred[1], gt[1]) - min(pred[0], gt[0])
    return inter / union if union > 0 else 0.0


def _clip(span: tuple[float, float], duration: float | None) -> tuple[float, float]:
    if duration is None or not duration > 0:
        return span
    return min(max(span[0], 0.0), duration), min(max(span[1], 0.0), duration)


def _column(kwargs: dict, name: str, n: int) -> list:
    values = kwargs.get(name)
    return list(values) if values is not None else [None] * n


def iou_reward(completions: list, solution: list, **kwargs) -> list[float]:
    """Temporal IoU of the answered span (clipped to the video) with ``solution``; 0 if unparsable."""
    durations = _column(kwargs, "duration", len(completions))
    rewards = []
    for completion, gt, duration in zip(completions, solution, durations, strict=True):
        span = parse_span(completion)
        rewards.append(0.0 if span is None else temporal_iou(_clip(span, duration), (float(gt[0]), float(gt[1]))))
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
    "format": format_reward,
    "format_soft": format_soft_reward,
}


def resolve_reward_funcs(names: list[str]) -> list[Callable]:
    """Map registry names or ``package.module:function`` paths to callables.

    Raises ValueError naming the bad entry and listing the known names, so a typo fails before the model loads.
    """
    funcs = []
    for name in names:
        if name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
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
        funcs.append(func)
    return funcs
