"""Answers in the forms a grounding policy writes while it explores, for checking that a preset's rewards read
them as the recipe's authors' code does (tests/test_authors_rewards.py).

``corpus(seed, n)`` draws ``n`` (answer, solution, duration) triples from a fixed list of forms: the canonical
answers of each recipe (TimeLens2's untagged JSON, TimeLens's sentence, our ``<think>``/``<answer>`` with
``S to E``), their variations (fences, tags, units, clock times, ``and``, dashes, spaces, reversed pairs,
exponents, two answer blocks, two ranges, several spans, strings for numbers, spans past the video) and a few
answers a policy should not write (NaN, 1e400, booleans, unclosed brackets, no numbers). The
expected rewards in tests/fixtures/authors_rewards.json were computed from these triples by each author's own code
(see that test's docstring); the triples are stored there too, so the check does not depend on this generator
staying the same.
"""

from __future__ import annotations

import random


def _number(rng: random.Random, value: float) -> str:
    style = rng.random()
    if style < 0.35:
        return f"{value:.1f}"
    if style < 0.6:
        return f"{value:.2f}"
    if style < 0.8:
        return str(int(round(value)))
    return f"{value:g}"


def _clock(value: float, hours: bool = False) -> str:
    minutes, seconds = divmod(int(round(value)), 60)
    if hours:
        return f"{minutes // 60:02d}:{minutes % 60:02d}:{seconds:02d}"
    return f"{minutes:02d}:{seconds:02d}"


def _pairs_json(rng: random.Random, spans: list[tuple[float, float]]) -> str:
    sep = rng.choice([", ", ",", " , "])
    inner = sep.join(f"[{_number(rng, s)}{sep}{_number(rng, e)}]" for s, e in spans)
    return f"[{inner}]"


THINK = [
    "The person appears near the door and then walks away.",
    "I look at the frames; the action starts after the light turns on.",
    "Go to the kitchen first, then the event happens in 3 - 5 seconds according to the timestamps.",
    "At 00:12 the person sits; they stand up later.",
    "",
]


def _form(rng: random.Random, spans: list[tuple[float, float]], duration: float) -> str:
    s, e = spans[0]
    n = lambda v: _number(rng, v)  # noqa: E731
    think = rng.choice(THINK)
    json_pairs = _pairs_json(rng, spans)
    forms = [
        # TimeLens2's canonical answer and its variations
        lambda: json_pairs,
        lambda: f"{json_pairs}\n",
        lambda: f"```json\n{json_pairs}\n```",
        lambda: f"```\n{json_pairs}\n```",
        lambda: f"The relevant spans are {json_pairs}.",
        lambda: f"Answer: {json_pairs}",
        lambda: f"<answer>{json_pairs}</answer>",
        lambda: f"<think>{think}</think>\n<answer>{json_pairs}</answer>",
        lambda: f"<thinking>{think}</thinking>\n<answer>{json_pairs}</answer>",
        lambda: f"<thinking>{think}</thinking><answer> {json_pairs} </answer>",
        lambda: f"[{n(s)}, {n(e)}]",
        lambda: f"[[[{n(s)}, {n(e)}]]]",
        lambda: f"[[{n(e)}, {n(s)}]]",  # reversed
        lambda: f"[[{n(s)}, {n(s)}]]",  # zero length
        lambda: f"[[{s:.3e}, {e:.3e}]]",  # exponents
        lambda: f'[["{n(s)}", "{n(e)}"]]',  # strings
        lambda: f'[["{_clock(s)}", "{_clock(e)}"]]',
        lambda: f"[[{n(s)}, {n(e)}, 0.9]]",  # a confidence
        lambda: f"[[-{n(s)}, {n(e)}]]",
        lambda: f"[[{n(s)}, {n(e)}], [{n(e + 5)}, {n(e + 2)}]]",  # second pair reversed
        lambda: f"[[{n(s)}, {n(e)}],]",  # not JSON
        lambda: f"[[{n(s)}, {n(e)}]",  # unclosed
        lambda: f"From {n(s)} - {n(e)} s the person moves; final: {json_pairs}",  # prose range, then JSON
        lambda: f"At {n(s)} to {n(e)} seconds.",
        lambda: f'{{"start": {n(s)}, "end": {n(e)}}}',
        lambda: f'[{{"start": {n(s)}, "end": {n(e)}}}]',
        lambda: f"[[{n(s)}, {n(e)}]] and also [[{n(s + 1)}, {n(e + 1)}]]",
        lambda: f"[[NaN, {n(e)}]]",
        lambda: f"[NaN, {n(e)}]",
        lambda: f"[1e400, {n(e)}]",
        lambda: f"[[1e400, {n(e)}]]",
        lambda: f"[true, {n(e)}]",
        lambda: f"[{n(s)}, {n(e + duration)}]",  # past the video
        # TimeLens's sentence and its variations
        lambda: f"The event happens in {n(s)} - {n(e)} seconds.",
        lambda: f"The event happens in {n(s)} - {n(e)} seconds",
        lambda: f"The event happens in {n(s)}-{n(e)} seconds.",
        lambda: f"The event happens in {n(s)} to {n(e)} seconds.",
        lambda: f"The event happens in {_clock(s)} - {_clock(e)} seconds.",
        lambda: f"The event happens in {_clock(s, True)} - {_clock(e, True)}.",
        lambda: f"The event happens in {n(e)} - {n(s)} seconds.",  # reversed
        lambda: f"The event happens in {n(s)} - {n(e)} seconds and again in {n(e + 2)} - {n(e + 6)} seconds.",
        lambda: f"The event starts at {n(s)} seconds and ends at {n(e)} seconds.",
        lambda: f"Starting time: {n(s)} seconds. Ending time: {n(e)} seconds",
        lambda: f"The event happens in {n(s)} - {n(e + duration)} seconds.",  # past the video
        lambda: "The event does not happen in the video.",
        lambda: f"The person goes to the door from {n(s)} to {n(e)}.",
        # ours, Time-R1's and TimeZero's <think>/<answer> with S to E, and their variations
        lambda: f"<think>{think}</think><answer>{n(s)} to {n(e)}</answer>",
        lambda: f"<think>{think}</think>\n<answer>{n(s)} to {n(e)}</answer>",
        lambda: f"  <think>{think}</think> <answer>{n(s)} to {n(e)}</answer>\n",
        lambda: f"<think>{think}</think><answer>{n(s)} and {n(e)}</answer>",
        lambda: f"<think>{think}</think><answer>{n(s)} - {n(e)}</answer>",
        lambda: f"<think>{think}</think><answer>{n(s)}s to {n(e)}s</answer>",
        lambda: f"<think>{think}</think><answer>{n(s)} seconds to {n(e)} seconds</answer>",
        lambda: f"<think>{think}</think><answer>{n(s)}  to  {n(e)}</answer>",
        lambda: f"<think>{think}</think><answer>{_clock(s)} to {_clock(e)}</answer>",
        lambda: f"<think>{think}</think><answer>from {n(s)} to {n(e)}</answer>",
        lambda: f"<think>{think}</think><answer>{n(e)} to {n(s)}</answer>",  # reversed
        lambda: f"<think>{think}</think><answer>{n(s)} TO {n(e)}</answer>",
        lambda: f"<think>{think}</think><answer>no idea</answer>",
        lambda: f"<think>{think}</think><answer>{n(s)} to {n(e + duration)}</answer>",  # past the video
        lambda: (
            f"<think>{think}</think><answer>{n(s)} to {n(e)}</answer><answer>{n(s + 1)} to {n(e + 1)}</answer>"
        ),
        lambda: f"<think>{think}</think><answer>{n(s)} to {n(e)}, or {n(s + 1)} to {n(e + 1)}</answer>",
        lambda: f"<answer>{n(s)} to {n(e)}</answer>",
        lambda: f"{n(s)} to {n(e)}",
        lambda: f"<think>{think}</think>",
        lambda: f"<think>{think}<answer>{n(s)} to {n(e)}</answer>",
        lambda: f"<think>{think}</think><answer>[[{n(s)}, {n(e)}]]</answer>",
        lambda: "",
        lambda: "   ",
    ]
    return rng.choice(forms)()


def corpus(seed: int = 0, n: int = 2000) -> list[dict]:
    """``n`` answers, each with a true solution (one span, or TimeLens2's list of spans) and a duration."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        duration = rng.choice([30.0, 32.4, 60.0, 120.5, 600.0])
        true_start = round(rng.uniform(0, duration * 0.8), 1)
        true_end = round(min(duration, true_start + rng.uniform(1, duration * 0.3)), 1)
        solution: list = [true_start, true_end]
        if rng.random() < 0.25:  # a multi-span query, as TimeLens2-93K has
            second = round(min(duration, true_end + rng.uniform(1, 10)), 1)
            solution = [
                [true_start, true_end],
                [second, round(min(duration + 5, second + rng.uniform(1, 6)), 1)],
            ]
        # the answer: near the truth, off by a random amount, sometimes two spans
        shift = rng.choice([0.0, rng.uniform(-3, 3), rng.uniform(-20, 20)])
        start = max(0.0, true_start + shift + rng.uniform(-1, 1))
        end = start + max(0.2, (true_end - true_start) * rng.uniform(0.3, 2.5))
        spans = [(start, end)]
        if rng.random() < 0.3:
            spans.append((end + rng.uniform(1, 8), end + rng.uniform(9, 20)))
        out.append({"answer": _form(rng, spans, duration), "solution": solution, "duration": duration})
    return out
