"""How each published recipe reads a time span out of a model's answer, written here from its authors' code.

A policy that explores writes answers in many forms: JSON with or without tags, prose ranges, clock times, two
answer blocks, a reversed pair. Recipes disagree on what such an answer says, and the reward a preset trains
with is only the authors' reward if it reads every form the way their code does. Each reader below follows one
code base, named with the commit it was read at; the rewards (:mod:`video_grpo.rewards.functions`, parameter ``reader``)
and the evaluation scorings (:mod:`video_grpo.evaluate`) call them.

- ``ours`` (:mod:`video_grpo.rewards.answers`): the last ``<answer>`` block; ``S to E`` or JSON pairs; reversed,
  negative or absurd values are unparsable; spans are clipped to the video for rewards.
- ``timelens2`` (MCG-NJU/TimeLens2 at f07353b, ``grpo/timelens/rewards/metrics.py`` ``extract_answer`` and
  ``extract_time``, ``funcs.py`` ``_intervals_from_text``): the answer is the first ``<thinking>``-then-
  ``<answer>`` block's content, else the first ``<answer>`` block's, else the whole text. It is then read as
  JSON, trying in turn the text itself, the inside of a fenced code block, and each balanced ``[[...]]`` in it:
  the first that parses as numeric pairs wins. Pairs are put in order (a reversed pair is swapped) and the
  answer counts only when every pair has start < end. Numbers are JSON numbers (exponents allowed) or strings
  holding one. Prose (``2 - 4 s``) is never a span. Nothing is clipped.
- ``timelens`` (TencentARC/TimeLens at 5d90c06; the files last changed in cbc3684): training
  (``training/utils/parser.py``, used by ``training/train/reward_funcs.py`` ``tiou_reward``) takes the answer block
  only when the text *starts* with ``<think>...</think>`` followed by it, lowercases, turns every ``to`` into ``-``,
  then reads clock times (``MM:SS``, ``HH:MM:SS``) in pairs; failing that, ``a - b`` ranges (or ``a to b``);
  failing that, any numbers, paired in order. The *first* pair is scored; start >= end scores 0. Evaluation
  (``timelens/utils.py``, and TimeLens2's VLMEvalKit ``evaluation/vlmeval/dataset/timelens.py`` at 2eb53e2) reads
  the whole output the same way without the ``to`` -> ``-`` step, and scores the first pair by plain IoU, unswapped.
- ``time_r1`` (xiaomi-research/time-r1 at 7f2b594, ``finetune.py`` last changed in 8f9c9df; www-Ye/Time-R1, the
  TimeZero release, at d1a0d54, ``src/open_r1/grpo_video.py`` last changed in bb6eac5; the same reader): the last
  ``<answer>`` block, and in it the last ``S to E`` or ``S and E`` with exactly one space on each side of the word;
  S and E are plain decimals. Nothing is clipped or reordered. Their format reward checks the tags only.
"""

from __future__ import annotations

import json
import math
import re

READERS = ("ours", "timelens2", "timelens", "time_r1")

Pair = tuple[float, float]


def check_reader(reader: str, allowed: tuple[str, ...], reward: str) -> None:
    """A clear error, at parse time, for a reader a reward does not define."""
    if reader not in allowed:
        raise ValueError(
            f"reward {reward!r}: reader {reader!r} is not one of {list(allowed)} "
            f"(readers: {list(READERS)}; see video_grpo.rewards.readers)"
        )


# -- TimeLens2 ------------------------------------------------------------------------------------------------

# Their CoT tag is "thinking" (or "redacted_thinking"); "<think>" answers fall through to the plain answer block.
_TL2_COT_ANSWER = re.compile(
    r"<(?:redacted_)?thinking>.*?</(?:redacted_)?thinking>\s*<answer>(.*?)</answer>", re.DOTALL
)
_TL2_FORMAT = re.compile(
    r"<(?:redacted_)?thinking>.*?</(?:redacted_)?thinking>\s*<answer>.*?</answer>", re.DOTALL
)
_FIRST_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FENCE = re.compile(r"```(?:json)?\s*([\s\S]*?)```", re.IGNORECASE)
_NUMERIC_STRING = re.compile(r"^-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?$")


def timelens2_answer(text: str) -> str:
    """The part of a completion TimeLens2 reads: a ``<thinking>`` + ``<answer>`` block's content, else the first
    ``<answer>`` block's, else the whole text (stripped in the first two cases only)."""
    text = text or ""
    for pattern in (_TL2_COT_ANSWER, _FIRST_ANSWER):
        found = pattern.search(text)
        if found:
            return found.group(1).strip()
    return text


def timelens2_format(text: str) -> bool:
    """TimeLens2's ``format`` reward: the whole text is one ``<thinking>`` block then one ``<answer>`` block."""
    return _TL2_FORMAT.fullmatch(text or "") is not None


def _number(value) -> float | None:
    """A JSON value as a finite float: a number (not a boolean) or a string holding one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str) and _NUMERIC_STRING.match(value.strip()):
        number = float(value.strip())
    else:
        return None
    return number if math.isfinite(number) else None


def _pair(item) -> Pair | None:
    """Two numbers at the head of a list, looking through lists of one element (``[[[a, b]]]``) a few levels."""
    for _ in range(8):
        if not isinstance(item, list | tuple) or not item:
            return None
        if len(item) >= 2:
            start, end = _number(item[0]), _number(item[1])
            if start is not None and end is not None:
                return start, end
        if len(item) == 1 and isinstance(item[0], list | tuple):
            item = item[0]
            continue
        return None
    return None


def _json_pairs(data) -> list[Pair] | None:
    """Numeric pairs in parsed JSON: a list of pairs, or one flat pair."""
    if not isinstance(data, list) or not data:
        return None
    while len(data) == 1 and isinstance(data[0], list):
        data = data[0]
    if not data:
        return None
    head = data[0]
    if isinstance(
        head, int | float
    ):  # a flat pair of JSON numbers; true/false count as numbers here, as theirs
        if len(data) >= 2 and all(isinstance(x, int | float) for x in data[:2]):
            return [(float(data[0]), float(data[1]))]
        return None
    if isinstance(head, list | tuple):
        pairs = [p for p in (_pair(item) for item in data if isinstance(item, list | tuple)) if p is not None]
        return pairs or None
    if len(data) >= 2:
        start, end = _number(data[0]), _number(data[1])
        if start is not None and end is not None:
            return [(start, end)]
    return None


def _double_bracket_arrays(text: str) -> list[str]:
    """Every balanced substring that opens with ``[[``, left to right; an unclosed one ends the search."""
    found, position = [], 0
    while True:
        start = text.find("[[", position)
        if start < 0:
            return found
        depth, cursor = 0, start
        while cursor < len(text):
            char = text[cursor]
            cursor += 1
            if char == "[":
                depth += 1
            elif char == "]":
                depth -= 1
                if depth == 0:
                    found.append(text[start:cursor])
                    position = cursor
                    break
        else:
            return found


def _json_candidates(text: str) -> list[str]:
    stripped = text.strip()
    candidates = [stripped]
    fence = _FENCE.search(stripped)
    if fence:
        candidates.append(fence.group(1).strip())
    candidates += _double_bracket_arrays(stripped)
    return list(dict.fromkeys(candidates))


def timelens2_pairs(answer: str) -> list[Pair]:
    """The pairs TimeLens2's ``extract_time`` finds in an answer, each put in order (min, max); [] for none."""
    if not answer or not answer.strip():
        return []
    for candidate in _json_candidates(answer):
        try:
            data = json.loads(candidate)
        except (
            ValueError,
            RecursionError,
        ):  # their code catches only JSONDecodeError: a 5,000-digit integer or
            continue  # a 1,000-deep array raises there and stops training; here such text is simply not a span
        pairs = _json_pairs(data)
        if pairs:
            return [(min(s, e), max(s, e)) for s, e in pairs]
    return []


def timelens2_spans(text: str) -> list[Pair] | None:
    """The spans TimeLens2's interval rewards score: every pair of the answer, or None when there is none or one
    has start >= end (an empty set then scores nothing and ``parse_penalty`` gives -1)."""
    pairs = timelens2_pairs(timelens2_answer(text))
    if not pairs or not all(s < e for s, e in pairs):
        return None
    return pairs


def _merged(spans) -> list[list[float]]:
    """TimeLens2's merge: sort by start, join a span that starts at or before the previous end."""
    merged: list[list[float]] = []
    for start, end in sorted(([float(s), float(e)] for s, e in spans), key=lambda span: span[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def timelens2_set_iou(pred: list[Pair], truth: list[Pair]) -> float:
    """TimeLens2's ``tiou`` (``iou_overlap_ratio``): the predicted spans merged, the true spans as annotated
    (not merged), the sum of pairwise overlaps over the sum of lengths minus it, clipped to [0, 1]."""
    if not truth:
        return 1.0 if not pred else 0.0
    if not pred:
        return 0.0
    pred_m = [[s, e] for s, e in _merged(pred) if s <= e]
    if not pred_m:
        return 0.0
    true_length = sum(e - s for s, e in truth)
    union = sum(e - s for s, e in pred_m) + true_length
    overlap = 0.0
    for ps, pe in pred_m:
        for ts, te in truth:
            overlap += max(0.0, min(pe, te) - max(ps, ts))
    union -= overlap
    return float(max(0.0, min(1.0, overlap / (union + 1e-16))))


# -- TimeLens --------------------------------------------------------------------------------------------------

_TIMELENS_COT_ANSWER = re.compile(r"<think>.*?</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_CLOCK = re.compile(r"\b(\d{1,2}:\d{2}:\d{2}(?:\.\d+)?|\d{1,2}:\d{2}(?:\.\d+)?)\b")
# Their patterns, made linear without changing what they match. A match never starts after a digit ``(?<!\d)``: the
# greedy number from there ends where the one from the run's first digit ends, and that attempt came first. And
# nothing gives back characters (``++``, ``?+``, ``*+``): a shorter number is followed by a digit or a point, and
# fewer spaces by a space, where the next part of the pattern cannot match. Their own patterns take hours on a
# million digits.
_NUMBER = r"(\d++\.?+\d*+)"
_RANGES = (
    re.compile(rf"(?<!\d){_NUMBER}\s*+-\s*+{_NUMBER}"),
    re.compile(rf"(?<!\d){_NUMBER}\s++to\s++{_NUMBER}"),
)
_ANY_NUMBER = re.compile(r"\b(\d+\.\d+|\d+)\b")
# The tags-only format check of TimeLens, Time-R1 and TimeZero.
_TAGS_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def timelens_answer(text: str) -> str:
    """TimeLens's training ``extract_answer``: the answer block when the text starts with a ``<think>`` block
    followed by one, else the whole text."""
    found = _TIMELENS_COT_ANSWER.match(text)
    return found.group(1) if found else text


def _clock_seconds(token: str) -> float:
    parts = token.split(":")
    if len(parts) == 3:
        return float(int(parts[0]) * 3600 + int(parts[1]) * 60 + float(parts[2]))
    return float(int(parts[0]) * 60 + float(parts[1]))


def timelens_pairs(paragraph: str, to_as_dash: bool = False) -> list[Pair]:
    """TimeLens's ``extract_time``: clock-time pairs, else ``a - b`` / ``a to b`` ranges, else any numbers paired;
    unswapped. ``to_as_dash``: its training parser's first step, every ``to`` -> ``-`` (evaluation skips it)."""
    text = str(paragraph).lower()
    if to_as_dash:
        text = text.replace("to", "-")
    clocks = _CLOCK.findall(text)
    clocks = clocks[: len(clocks) // 2 * 2]
    seconds = [_clock_seconds(token) for token in clocks]
    pairs = [(seconds[i], seconds[i + 1]) for i in range(0, len(seconds), 2)]
    if not pairs:
        for pattern in _RANGES:
            found = pattern.findall(text)
            if found:
                pairs = [(float(a), float(b)) for a, b in found]
                break
    if not pairs:
        numbers = _ANY_NUMBER.findall(text)
        numbers = numbers[: len(numbers) // 2 * 2]
        pairs = [(float(numbers[i]), float(numbers[i + 1])) for i in range(0, len(numbers), 2)]
    return pairs


def timelens_first_span(text: str) -> Pair | None:
    """The pair TimeLens's training reward scores: the first its training parser finds in the answer; None for
    none or start >= end (reward 0)."""
    pairs = timelens_pairs(timelens_answer(text), to_as_dash=True)
    if not pairs or pairs[0][0] >= pairs[0][1]:
        return None
    return pairs[0]


def timelens_format(text: str) -> bool:
    """TimeLens's ``format_reward``: the whole text (not stripped) is a ``<think>`` then an ``<answer>`` block."""
    return _TAGS_FORMAT.fullmatch(text) is not None


def plain_iou(a: Pair, b: Pair) -> float:
    """TimeLens's and VLMEvalKit's ``iou``, unswapped: overlap / (max end - min start); 0 when that is <= 0."""
    low, high = min(a[0], b[0]), max(a[1], b[1])
    denominator = high - low
    if denominator <= 0:
        return 0.0
    return max(min(a[1], b[1]) - max(a[0], b[0]), 0.0) / denominator


# -- Time-R1 and TimeZero ------------------------------------------------------------------------------------

_ALL_ANSWERS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TO_OR_AND = re.compile(rf"(?<!\d){_NUMBER} (to|and) {_NUMBER}", re.IGNORECASE)  # linear: see _RANGES


def time_r1_span(text: str) -> Pair | None:
    """Time-R1's and TimeZero's ``parse_timestamp_output``: the last ``S to E`` / ``S and E`` of the last
    ``<answer>`` block, as written (a reversed span stays reversed); None when there is none."""
    blocks = _ALL_ANSWERS.findall(text)
    if not blocks:
        return None
    found = _TO_OR_AND.findall(blocks[-1])
    if not found:
        return None
    return float(found[-1][0]), float(found[-1][2])


def time_r1_format(text: str) -> bool:
    """Time-R1's and TimeZero's ``format_reward``: the stripped text is a ``<think>`` then an ``<answer>`` block
    (tags only: what the answer says is not checked, and a second block can hide in the first one's match)."""
    return _TAGS_FORMAT.fullmatch(text.strip()) is not None


def time_r1_iou(pred: Pair, truth: Pair) -> float:
    """Their IoU: overlap / (max end - min start), with the span as written; 0 when that is <= 0 (where their
    code would fail)."""
    (start, end), (true_start, true_end) = pred, truth
    intersection = max(0, min(end, true_end) - max(start, true_start))
    union = max(end, true_end) - min(start, true_start)
    return intersection / union if union > 0 else 0.0


def time_r1_iou_dist(pred: Pair, truth: Pair, duration: float) -> float:
    """Time-R1's ``iou_v2`` (the paper's reward, TimeRFT's ``--reward_funcs iou_v2``): IoU x (1 - |dS| / D) x
    (1 - |dE| / D), each time divided by the duration first, as their code does; no clamping."""
    (start, end), (true_start, true_end) = pred, truth
    iou = time_r1_iou(pred, truth)
    return (
        iou
        * (1 - abs(1.0 * true_start / duration - 1.0 * start / duration))
        * (1 - abs(1.0 * true_end / duration - 1.0 * end / duration))
    )
