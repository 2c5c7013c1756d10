"""Answers in the forms a TimeLens2 / Qwen3-VL model writes to TimeLens's sentence prompt, generated with a fixed seed:
the input of ``tests/test_timelens_scoring.py`` and of the one-off script that computed its fixture with TimeLens2's
own ``extract_time`` and ``iou`` (see that test's docstring). Changing this file changes the answers: the test
then fails on the fixture's hash until the fixture is made again the same way."""

from __future__ import annotations

import hashlib
import json
import random

SEED = 44
COUNT = 360


def _clock(seconds: float, hours: bool = False, decimals: int = 0) -> str:
    seconds = max(seconds, 0.0)
    whole = int(seconds)
    minutes, secs = divmod(whole, 60)
    frac = f"{seconds - whole:.{decimals}f}"[1:] if decimals else ""
    if hours:
        return f"{minutes // 60:02d}:{minutes % 60:02d}:{secs:02d}{frac}"
    return f"{minutes:02d}:{secs:02d}{frac}"


def _number(x: float, rng: random.Random) -> str:
    """A time as a model writes it: 1 or 2 decimals, or a whole number when it is one."""
    style = rng.random()
    if style < 0.45:
        return f"{x:.1f}"
    if style < 0.85:
        return f"{x:.2f}"
    return f"{round(x):d}"


def _forms(s: str, e: str, rng: random.Random, a: str, b: str, duration: float) -> list[str]:
    """Every form, given the predicted start ``s`` and end ``e`` already written, a second span ``a``-``b`` and
    the video's length."""
    return [
        f"The event happens in {s} - {e} seconds.",
        f"The event happens in {s} - {e} seconds",
        f"[[{s}, {e}]]",
        f"[[{s}, {e}], [{a}, {b}]]",
        f"```json\n[[{s}, {e}]]\n```",
        f"The event happens from {s} to {e} seconds.",
        f"From {s} TO {e} seconds.",
        f"The event happens in {s}-{e} seconds.",
        f"The event happens in {s}s - {e}s.",
        f"The event happens between {s} and {e} seconds.",
        f"Starting time: {s} seconds. Ending time: {e} seconds.",
        f"The event happens in {e} - {s} seconds.",  # reversed
        f"The event happens in {s} - {e} seconds and again in {a} - {b} seconds.",
        f"The event happens in {a} - {b} seconds and again in {s} - {e} seconds.",
        "I cannot find the described event in the video.",
        f"The event happens at {s} seconds.",  # one number only
        f"The person appears 2 times; the event happens in {s} - {e} seconds.",
        f"Starting at {s} seconds, it lasts 3 seconds and ends at {e} seconds.",
        f"In this {duration:.0f}-second video, the event happens in {s} - {e} seconds.",
        f"The video is {duration:.1f} seconds long. The event happens in {s} - {e} seconds.",
        f"<think>The person seems to start near {a} and stop near {b}.</think>\n"
        f"<answer>The event happens in {s} - {e} seconds.</answer>",
        f"<think>Looking at the frames around {a} - {b} seconds first.</think><answer>[[{s}, {e}]]</answer>",
        f"<answer>{s} to {e}</answer>",
        f"The event happens in {s}–{e} seconds.",  # an en dash
        f"[[-0.5, {e}]]",
        f"The event happens in -1 - {e} seconds.",
        f'{{"start": {s}, "end": {e}}}',
        f"The event happens in {s} - {e} seconds. Confidence: 0.9.",
    ]


def _clock_forms(s: float, e: float, rng: random.Random) -> list[str]:
    return [
        f"The event happens in {_clock(s)} - {_clock(e)}.",
        f"The event happens from {_clock(s, True)} to {_clock(e, True)}.",
        f"{_clock(s, True, 1)} - {_clock(e, True, 1)}",
        f"The event happens at {_clock(s)} until {e:.1f} seconds.",  # one clock time: an odd count
        f"The event happens in {_clock(s)} - {_clock(e)} and {_clock(e + 2)}.",  # three clock times
    ]


def timelens2_style_answers(seed: int = SEED, count: int = COUNT) -> list[dict]:
    """``count`` prediction records (``output``, ``solution``, ``duration``): Charades-TimeLens-like videos of
    12-60 s with a true span (one in eight a nested solution of two windows), answered with the true span moved by
    a few seconds (now and then reversed or far off) and written in one of the forms above."""
    rng = random.Random(seed)
    records = []
    for index in range(count):
        duration = round(rng.uniform(12.0, 60.0), 2)
        start = round(rng.uniform(0.0, duration * 0.75), 1)
        end = round(min(duration, start + rng.uniform(1.5, 14.0)), 1)
        solution: list = [start, end]
        if rng.random() < 0.125:
            other = round(rng.uniform(0.0, duration - 2.0), 1)
            solution = [[start, end], [other, round(other + 2.0, 1)]]
        noise = 1.0 if rng.random() < 0.6 else 5.0
        s = max(0.0, start + rng.gauss(0.0, noise))
        e = max(s + 0.1, end + rng.gauss(0.0, noise))
        if rng.random() < 0.05:
            s, e = e, s
        a = max(0.0, s + rng.uniform(-10.0, 10.0))
        b = a + rng.uniform(1.0, 8.0)
        if rng.random() < 0.15:
            form = rng.choice(_clock_forms(s, e, rng))
        else:
            written = [_number(x, rng) for x in (s, e, a, b)]
            form = rng.choice(_forms(written[0], written[1], rng, written[2], written[3], duration))
        records.append({"id": f"q{index}", "output": form, "solution": solution, "duration": duration})
    return records


def answers_hash(records: list[dict]) -> str:
    """What the fixture was computed on, so that a changed generator cannot pass against an old fixture."""
    text = json.dumps([[r["output"], r["solution"]] for r in records], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
