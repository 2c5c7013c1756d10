"""Reward functions for temporal grounding, and the registry the YAML names them from.

Every reward follows TRL's calling convention: ``f(prompts=, completions=, completion_ids=, **columns)``
where each dataset column (``solution``, ``duration``, ...) arrives as a per-sample list and completions are
either strings or conversational ``[{"role": "assistant", "content": ...}]`` lists. They never raise on
model output and always return one float per completion.

How an answer is read is the ``reader`` of a span reward (:mod:`video_grpo.rewards.readers`; ``reward_kwargs:
{iou: {reader: time_r1}}``), so that a preset that follows a published recipe scores every answer form as its
authors' code does (tests/test_authors_rewards.py):

- ``ours`` (:mod:`video_grpo.rewards.answers`, shared with evaluation): the last ``<answer>`` block counts, and in it
  ``S to E`` spans or the JSON ``[[S, E], ...]``. S > E, negative values and values above 10^6 s are unparsable
  and score 0. Predicted spans are then clipped to ``[0, duration]`` when the duration is known; true spans are
  used as given. The default of ``iou``, ``iou_dist`` and ``format``.
- ``timelens2``: TimeLens2's JSON reading and set IoU, nothing clipped; the default of ``tiou``, ``twass`` and
  ``parse_penalty`` (TimeLens2's rewards, trained as ``twass1,tiou,parse_penalty``).
- ``timelens``: TimeLens's ``tiou_reward``, the first pair of its parser, nothing clipped; the default of
  ``iou_answer_only`` (answers ``The event happens in S - E seconds.``, no tags, no format term).
- ``time_r1``: Time-R1's and TimeZero's ``iou``, ``iou_v2`` (our ``iou_dist``) and tags-only ``format``.

Multi-span answers (``multi_span_iou``): every span in the last answer block (``S to E`` separated by ``;`` or
``,``, or the JSON form) is a predicted span. Predicted and true spans are each merged into a union of
intervals, and the reward is |pred ∩ true| / |pred ∪ true| measured in seconds. Overlapping predictions
therefore cannot earn double credit, and one long span covering every true window is penalised by the union.

``twass`` (:func:`video_grpo.rewards.span_sets.twass_score`) is exp(-beta * W1 / L) of every answered span against every
true span, L the merged true length (TimeLens2 since f07353b; ``normalizer: union`` is their earlier form). Unlike
IoU it is above 0 for a miss and falls with the miss's distance, so a group of answers that all miss still gets an
ordering. Built-in rewards' parameters are checked when the recipe is parsed (:func:`check_params`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import re
from collections.abc import Callable

from video_grpo.rewards.answers import (  # noqa: F401  (re-exported: the rewards' public parsing API)
    ANSWER_CLOSE,
    ANSWER_ONLY_TEMPLATE,
    ANSWER_OPEN,
    DEFAULT_ANSWER_TEMPLATE,
    JSON_ANSWER_TEMPLATE,
    MAX_SECONDS,
    answer_block,
    completion_text,
    parse_answer_only,
    parse_answer_spans,
    parse_span,
    parse_span_in,
    parse_spans_in,
    render_answer,
    render_solution,
    solution_spans,
)
from video_grpo.rewards.readers import (
    check_reader,
    plain_iou,
    time_r1_format,
    time_r1_iou,
    time_r1_iou_dist,
    time_r1_span,
    timelens2_format,
    timelens2_set_iou,
    timelens2_spans,
    timelens_first_span,
    timelens_format,
)
from video_grpo.rewards.span_sets import NORMALIZERS, twass_score, union_iou  # noqa: F401  (re-exported)

_FORMAT_RE = re.compile(
    r"\A\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*<answer>((?:(?!</?think>|</?answer>).)*)</answer>\s*\Z",
    re.DOTALL,
)


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


def _span_iou_rewards(
    parse: Callable[[object], tuple[float, float] | None], completions: list, solution: list, kwargs: dict
) -> list[float]:
    """Temporal IoU of each completion's span, read by ``parse`` and clipped to the video, with ``solution``; 0
    when ``parse`` finds no span. A multi-span solution (a list of spans) is scored as a set: the union IoU of
    the one span with all true spans (TimeLens2's ``tiou`` for a one-span answer)."""
    durations = _column(kwargs, "duration", len(completions))
    rewards = []
    for completion, gt, duration in zip(completions, solution, durations, strict=True):
        span = parse(completion)
        if span is None:
            rewards.append(0.0)
        elif len(gt) and isinstance(gt[0], list | tuple):
            rewards.append(union_iou([_clip(span, duration)], solution_spans(gt)))
        else:
            rewards.append(temporal_iou(_clip(span, duration), (float(gt[0]), float(gt[1]))))
    return rewards


def _authors_iou(reader: str, completion, gt) -> float:
    """A one-span IoU as the recipe of ``reader`` computes it: its own span, unclipped (video_grpo.rewards.readers)."""
    text = completion_text(completion)
    windows = solution_spans(gt)
    if reader == "time_r1":
        span = time_r1_span(text)
        return 0.0 if span is None else max(time_r1_iou(span, window) for window in windows)
    span = timelens_first_span(text)  # TimeLens scores its first true span ("gt = gt[0]")
    return 0.0 if span is None else plain_iou(windows[0], span)


def iou_reward(completions: list, solution: list, reader: str = "ours", **kwargs) -> list[float]:
    """Temporal IoU of the answered span with ``solution`` (one span, or a list scored as a set); 0 if unparsable.

    ``reader`` (video_grpo.rewards.readers): ``ours`` (the last span of the last ``<answer>`` block, clipped to the
    video), ``time_r1`` (Time-R1's and TimeZero's ``iou``: the last ``S to E``/``S and E`` of the last block, as
    written, unclipped) or ``timelens`` (TimeLens's ``tiou``: the first pair, unclipped)."""
    if reader == "ours":
        return _span_iou_rewards(parse_span, completions, solution, kwargs)
    return [_authors_iou(reader, c, gt) for c, gt in zip(completions, solution, strict=True)]


def iou_answer_only_reward(
    completions: list, solution: list, reader: str = "timelens", **kwargs
) -> list[float]:
    """TimeLens's reward for answer-only sentences (``The event happens in S - E seconds.``), with no format term.

    ``reader``: ``timelens`` (the default: TimeLens's ``tiou_reward`` exactly; the first pair its parser finds,
    start >= end scores 0, nothing clipped) or ``ours`` (the last span, clipped to the video; our rule before
    issue 44)."""
    if reader == "ours":
        return _span_iou_rewards(parse_answer_only, completions, solution, kwargs)
    return [_authors_iou("timelens", c, gt) for c, gt in zip(completions, solution, strict=True)]


def iou_dist_reward(completions: list, solution: list, reader: str = "ours", **kwargs) -> list[float]:
    """IoU x (1 - |dS|/D) x (1 - |dE|/D): sharper credit near the true boundaries; 0 when IoU is 0.

    D is the video duration (the larger span end when unknown). With several true spans (a multi-span
    solution), the best over them, as evaluation's best_window. ``reader``: ``ours`` (the last span, clipped to
    the video, factors floored at 0) or ``time_r1`` (Time-R1's ``iou_v2`` exactly: its own span, unclipped, no
    floor)."""
    durations = _column(kwargs, "duration", len(completions))
    rewards = []
    for completion, gt, duration in zip(completions, solution, durations, strict=True):
        windows = solution_spans(gt)
        if reader == "time_r1":
            span = time_r1_span(completion_text(completion))
        else:
            span = parse_span(completion)
            span = None if span is None else _clip(span, duration)
        if span is None:
            rewards.append(0.0)
            continue
        scores = []
        for gs, ge in windows:
            d = float(duration) if duration and duration > 0 else max(span[1], ge, 1e-6)
            if reader == "time_r1":
                scores.append(time_r1_iou_dist(span, (gs, ge), d))
                continue
            iou = temporal_iou(span, (gs, ge))
            scores.append(iou * max(0.0, 1 - abs(span[0] - gs) / d) * max(0.0, 1 - abs(span[1] - ge) / d))
        rewards.append(max(scores))
    return rewards


def _tagged_spans(completion) -> list[tuple[float, float]] | None:
    """Every span of the last ``<answer>`` block; None without a block or a span."""
    block = answer_block(completion_text(completion))
    return parse_spans_in(block) if block is not None else None


def _span_set_rewards(
    completions: list,
    solution: list,
    columns: dict,
    read: Callable[[object], list[tuple[float, float]] | None],
    score: Callable[[list, list], float],
) -> list[float]:
    """``score(answered spans clipped to the video, true spans)`` per completion, the spans found by ``read``; 0 when
    it finds none. The set rewards differ only in how they read an answer and score the two sets."""
    durations = _column(columns, "duration", len(completions))
    rewards = []
    for completion, gt, duration in zip(completions, solution, durations, strict=True):
        spans = read(completion)
        rewards.append(score([_clip(sp, duration) for sp in spans], solution_spans(gt)) if spans else 0.0)
    return rewards


def _timelens2_set_rewards(
    completions: list, solution: list, score: Callable[[list, list], float]
) -> list[float]:
    """``score(answered spans, true spans)`` with TimeLens2's reading (video_grpo.rewards.readers.timelens2_spans):
    nothing clipped, 0 when the answer gives no valid span set."""
    rewards = []
    for completion, gt in zip(completions, solution, strict=True):
        spans = timelens2_spans(completion_text(completion))
        rewards.append(0.0 if spans is None else score(spans, solution_spans(gt)))
    return rewards


def multi_span_iou_reward(completions: list, solution: list, **kwargs) -> list[float]:
    """Union IoU of all answered spans with all true spans (QVHighlights-style ``relevant_windows``).

    ``solution`` may be one ``[start, end]`` or a list of them."""
    return _span_set_rewards(completions, solution, kwargs, _tagged_spans, union_iou)


def twass_reward(
    completions: list,
    solution: list,
    beta: float = 1.0,
    reader: str = "timelens2",
    normalizer: str = "truth",
    **kwargs,
) -> list[float]:
    """TimeLens2's temporal Wasserstein reward exp(-beta * W1 / L) of every answered span against ``solution``
    (one span or a list); 0 when the answer gives no span.

    ``beta``: TimeLens2's released recipe uses 1 (``twass1``). ``normalizer``: L is the merged true length
    (``truth``, TimeLens2 since f07353b, the default) or the union of both sets (``union``, their earlier
    release: broad answers enlarge it and lose little; for ablations). ``reader``: ``timelens2`` (the default:
    their JSON reading, nothing clipped) or ``ours`` (our parser, clipped to the video; for ``S to E`` tasks).
    Set them with ``reward_kwargs: {twass: {beta: 1.0}}``."""

    def score(pred: list, truth: list) -> float:
        if not all(math.isfinite(v) for span in pred for v in span):
            return 0.0  # a JSON 1e400 is inf: their reward is NaN there, which TRL's sum skips, as it does 0
        return twass_score(pred, truth, beta=beta, normalizer=normalizer)

    if reader == "timelens2":
        return _timelens2_set_rewards(completions, solution, score)
    return _span_set_rewards(completions, solution, kwargs, parse_answer_spans, score)


def tiou_reward(completions: list, solution: list, reader: str = "timelens2", **kwargs) -> list[float]:
    """TimeLens2's ``tiou``: the set IoU of every answered span with ``solution`` (one span or a list); 0 when
    nothing parses. ``reader``: ``timelens2`` (the default: their reading and their set IoU, which merges the
    answered spans but not the true ones, nothing clipped) or ``ours`` (our parser, both sets merged, clipped to
    the video)."""
    if reader == "timelens2":
        return _timelens2_set_rewards(completions, solution, timelens2_set_iou)
    return _span_set_rewards(completions, solution, kwargs, parse_answer_spans, union_iou)


def parse_penalty_reward(completions: list, reader: str = "timelens2", **kwargs) -> list[float]:
    """0 when the answer gives a span set, -1 when it does not, read by ``reader`` (``timelens2``, the default,
    or ``ours``: :func:`video_grpo.rewards.answers.parse_answer_spans`)."""
    read = parse_answer_spans if reader == "ours" else (lambda c: timelens2_spans(completion_text(c)))
    return [0.0 if read(completion) is not None else -1.0 for completion in completions]


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


_AUTHORS_FORMAT = {"time_r1": time_r1_format, "timelens": timelens_format, "timelens2": timelens2_format}


def format_reward(completions: list, reader: str = "ours", **kwargs) -> list[float]:
    """1.0 for exactly ``<think>...</think><answer>S to E</answer>`` (whitespace allowed), else 0.

    ``reader``: ``ours`` (that, with a parsable span), ``time_r1`` (Time-R1's and TimeZero's tags-only check of
    the stripped text), ``timelens`` (TimeLens's, unstripped) or ``timelens2`` (``<thinking>`` tags)."""
    if reader != "ours":
        check = _AUTHORS_FORMAT[reader]
        return [1.0 if check(completion_text(c)) else 0.0 for c in completions]
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
    "twass": twass_reward,
    "tiou": tiou_reward,
    "parse_penalty": parse_penalty_reward,
}

# The readers each built-in reward defines (video_grpo.rewards.readers), its default first.
REWARD_READERS: dict[str, tuple[str, ...]] = {
    "iou": ("ours", "time_r1", "timelens"),
    "iou_answer_only": ("timelens", "ours"),
    "iou_dist": ("ours", "time_r1"),
    "format": ("ours", "time_r1", "timelens", "timelens2"),
    "twass": ("timelens2", "ours"),
    "tiou": ("timelens2", "ours"),
    "parse_penalty": ("timelens2", "ours"),
}
# The rewards that read every span of an answer: their reader is the one evaluation's and curation's "set" scoring
# use for the recipe (video_grpo.rewards.functions.recipe_reader).
SET_REWARDS = ("tiou", "twass", "parse_penalty")


def _positive_number(value) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def check_params(name: str, params: dict) -> None:
    """Refuse a bad parameter value of a built-in reward when the recipe is parsed, not at the first reward call
    (after the model has loaded). The message names the reward_kwargs entry and the allowed values."""
    where = f"reward_kwargs: {{{name}: {params}}}"
    if "reader" in params:
        check_reader(params["reader"], REWARD_READERS.get(name, ("ours",)), name)
    if "beta" in params and not _positive_number(params["beta"]):
        raise ValueError(
            f"{where}: beta must be a positive number (TimeLens2's twass1: 1.0), got {params['beta']!r}"
        )
    if "normalizer" in params and params["normalizer"] not in NORMALIZERS:
        raise ValueError(
            f"{where}: normalizer must be one of {list(NORMALIZERS)}, got {params['normalizer']!r}"
        )
    if "max_think_words" in params and not (
        _positive_number(params["max_think_words"]) and float(params["max_think_words"]).is_integer()
    ):
        raise ValueError(
            f"{where}: max_think_words must be a positive whole number, got {params['max_think_words']!r}"
        )


def reader_of(name: str, params: dict | None) -> str | None:
    """The reader a built-in reward uses with these parameters; None for a reward with no reader."""
    if name not in REWARD_READERS:
        return None
    return (params or {}).get("reader", REWARD_READERS[name][0])


def recipe_reader(names: list[str], params: dict[str, dict] | None = None) -> str:
    """The reader a recipe's set rewards (tiou, twass, parse_penalty) use, so that evaluation and curation read its
    answers as training does; ``ours`` when it has none. They must agree."""
    readers = {reader_of(n, (params or {}).get(n)) for n in names if n in SET_REWARDS}
    if len(readers) > 1:
        raise ValueError(
            f"reward_kwargs: the set rewards of {names} read answers with different readers {sorted(readers)}; "
            "give them one reader, so that training, evaluation and curation read an answer the same way"
        )
    return readers.pop() if readers else "ours"


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


# Where the flat modules of video_grpo 0.1 went when the package was grouped by stage (docs/internals.md), so a
# recipe written before that, naming a plug-in as ``video_grpo.span_sets:twass_score``, still loads.
MOVED_MODULES = {
    "video_grpo.data": "video_grpo.data.dataset",
    "video_grpo.annotations": "video_grpo.data.annotations",
    "video_grpo.annotation_files": "video_grpo.data.annotation_files",
    "video_grpo.timelens_annotations": "video_grpo.data.timelens_annotations",
    "video_grpo.sources": "video_grpo.data.sources",
    "video_grpo.video": "video_grpo.data.video",
    "video_grpo.frame_cache": "video_grpo.data.frame_cache",
    "video_grpo.difficulty_draw": "video_grpo.data.difficulty_draw",
    "video_grpo.sample_weights": "video_grpo.data.sample_weights",
    "video_grpo.families": "video_grpo.inputs.families",
    "video_grpo.processing": "video_grpo.inputs.processing",
    "video_grpo.positions": "video_grpo.inputs.positions",
    "video_grpo.encoder": "video_grpo.inputs.encoder",
    "video_grpo.prefix": "video_grpo.inputs.prefix",
    "video_grpo.prefill": "video_grpo.rollout.prefill",
    "video_grpo.decode": "video_grpo.rollout.decode",
    "video_grpo.static_cache": "video_grpo.rollout.static_cache",
    "video_grpo.state_fork": "video_grpo.inputs.state_fork",
    "video_grpo.answers": "video_grpo.rewards.answers",
    "video_grpo.readers": "video_grpo.rewards.readers",
    "video_grpo.span_sets": "video_grpo.rewards.span_sets",
    "video_grpo.span_scoring": "video_grpo.rewards.span_scoring",
    "video_grpo.grpo_math": "video_grpo.loss.grpo_math",
    "video_grpo.guidance": "video_grpo.loss.guidance",
    "video_grpo.distributed": "video_grpo.runtime.distributed",
    "video_grpo.launch_env": "video_grpo.runtime.launch_env",
    "video_grpo.checkpoints": "video_grpo.runtime.checkpoints",
    "video_grpo.checkpointing": "video_grpo.runtime.checkpointing",
    "video_grpo.memory_check": "video_grpo.runtime.memory_check",
    "video_grpo.memory_meters": "video_grpo.runtime.memory_meters",
    "video_grpo.plan.live_memory": "video_grpo.runtime.live_memory",
}


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
            check_params(name, params.get(name) or {})
            continue
        if ":" not in name:
            raise ValueError(
                f"unknown reward {name!r}. Known rewards: {', '.join(sorted(REWARD_FUNCS))}; "
                "or give a plug-in as 'package.module:function'."
            )
        module_name, _, attr = name.partition(":")
        module_name = MOVED_MODULES.get(module_name, module_name)
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
