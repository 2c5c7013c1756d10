"""TimeLens2's temporal Wasserstein reward (`twass`) and `parse_penalty`: hand-computed values, the formula
against an independent numerical computation, and the properties the issue asks for. L is the merged true length
(TimeLens2 since f07353b) unless a test names the union normaliser (their earlier release, kept for ablations)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from video_grpo.rewards.functions import REWARD_FUNCS, resolve_reward_funcs, twass_score
from video_grpo.rewards.span_sets import merge_spans, wasserstein1


def _grid(spans_sets, per_second: int):
    """Cell edges from the earliest to the latest time, ``per_second`` cells a second, and cell midpoints."""
    lo = min(s for spans in spans_sets for s, _ in spans)
    hi = max(e for spans in spans_sets for _, e in spans)
    cells = max(1, round((hi - lo) * per_second))
    edges = np.linspace(lo, hi, cells + 1)
    return edges, 0.5 * (edges[1:] + edges[:-1])


def _inside(spans, mids):
    inside = np.zeros_like(mids, dtype=bool)
    for s, e in spans:
        inside |= (mids >= s) & (mids <= e)
    return inside


def grid_w1(pred, truth, per_second: int = 4000) -> float:
    """W1 as the integral of |F_p - F_t| on a fine grid, each CDF the running integral of its set's indicator:
    independent of the module's merging and quantile formula. Positive-length spans only."""
    edges, mids = _grid([pred, truth], per_second)

    def cdf(spans):
        mass = np.concatenate([[0.0], np.cumsum(_inside(spans, mids))])
        return mass / mass[-1]

    return float(np.trapezoid(np.abs(cdf(pred) - cdf(truth)), edges))


def grid_union(spans, per_second: int = 4000) -> float:
    """Measure of the union of ``spans`` on the same kind of grid."""
    edges, mids = _grid([spans], per_second)
    return float(_inside(spans, mids).sum() * (edges[1] - edges[0]))


def covered_quarters(spans) -> set[int]:
    """The quarter-second cells a set of quarter-aligned spans covers: set equality without merging."""
    return {q for s, e in spans for q in range(round(4 * s), round(4 * e))}


# Span sets on a quarter-second grid (exact in binary floating point), 1 to 4 spans of positive length, possibly
# overlapping or touching.
quarter_span = st.tuples(st.integers(0, 160), st.integers(1, 40)).map(lambda t: (t[0] / 4, (t[0] + t[1]) / 4))
span_set = st.lists(quarter_span, min_size=1, max_size=4)


def test_hand_computed_values():
    assert wasserstein1([(0, 1)], [(2, 3)]) == pytest.approx(2.0)  # a shift moves all mass by 2
    assert wasserstein1([(0, 2)], [(0, 1)]) == pytest.approx(0.5)  # |2u - u| over [0, 1]
    assert wasserstein1([(5, 5)], [(0, 10)]) == pytest.approx(2.5)  # a point: E|X - 5| for X ~ U[0, 10]
    # L = the true length (1 here); with the union normaliser, the union of both sets (2)
    assert twass_score([(0, 1)], [(2, 3)]) == pytest.approx(math.exp(-2 / 1))
    assert twass_score([(0, 1)], [(2, 3)], normalizer="union") == pytest.approx(math.exp(-2 / 2))
    assert twass_score([(0, 1)], [(2, 3)], beta=3.0) == pytest.approx(math.exp(-3 * 2 / 1))
    # two predicted spans against one: W1 = 1/8 + 11/8, L = 1 (truth) or 2 (union)
    assert twass_score([(0, 1), (3, 4)], [(0, 1)]) == pytest.approx(math.exp(-1.5 / 1))
    assert twass_score([(0, 1), (3, 4)], [(0, 1)], normalizer="union") == pytest.approx(math.exp(-1.5 / 2))
    assert twass_score([(0, 1)], [(0, 1)]) == 1.0
    # docs/rewards.md's examples: a miss 2 s after a 10 s event, and one 20 s after it
    assert twass_score([(22, 32)], [(10, 20)]) == pytest.approx(math.exp(-12 / 10))
    assert twass_score([(40, 50)], [(10, 20)]) == pytest.approx(math.exp(-30 / 10))
    assert twass_score([(22, 32)], [(10, 20)], normalizer="union") == pytest.approx(math.exp(-12 / 20))
    # the issue's: a whole-video answer to a 3 s event in a 30 s video; W1 = 53/6 (|27u - 6| over [0, 1])
    assert wasserstein1([(0, 30)], [(6, 9)]) == pytest.approx(53 / 6)
    assert (
        twass_score([(0, 30)], [(6, 9)])
        == pytest.approx(math.exp(-53 / 18))
        == pytest.approx(0.0526, abs=1e-4)
    )
    assert twass_score([(0, 30)], [(6, 9)], normalizer="union") == pytest.approx(0.745, abs=1e-3)
    assert twass_score([], [(0, 1)]) == 0.0


@pytest.mark.parametrize(
    "pred, truth",
    [
        ([(0, 1)], [(2, 3)]),
        ([(1, 7)], [(3, 4)]),
        ([(0, 10)], [(2, 5)]),
        ([(2, 9)], [(0, 4)]),
        ([(0, 1), (3, 4)], [(0, 1)]),
        ([(0, 2), (5, 6), (1, 3)], [(4, 8), (10, 11)]),
        ([(10, 20)], [(0, 2), (4, 5), (30, 31)]),
    ],
)
def test_matches_an_independent_computation(pred, truth):
    w1 = wasserstein1(pred, truth)
    assert w1 == pytest.approx(grid_w1(pred, truth), rel=1e-4, abs=1e-6)
    assert twass_score(pred, truth) == pytest.approx(math.exp(-w1 / grid_union(truth)), rel=1e-4)
    union = math.exp(-w1 / grid_union(pred + truth))
    assert twass_score(pred, truth, normalizer="union") == pytest.approx(union, rel=1e-4)


def test_registry_reward_reads_every_span_and_penalises_unparsable_answers():
    twass, penalty = REWARD_FUNCS["twass"], REWARD_FUNCS["parse_penalty"]
    completions = [
        "<answer>[[0, 1], [3, 4]]</answer>",  # JSON form, two spans
        "<think>x</think><answer>0 to 1; 3 to 4</answer>",  # our form, the same two spans
        "[[0, 1], [3, 4]]",  # untagged, as TimeLens2 answers
        "no idea",
        "<answer>3 to 2</answer>",  # S > E
        [{"role": "assistant", "content": "<answer>2 to 3</answer>"}],
    ]
    # our reader (reward_kwargs {twass: {reader: ours}}): both span forms, tagged or not; W1 = 1.5, L = 1
    rewards = twass(completions, [[0, 1]] * 6, duration=[20.0] * 6, reader="ours")
    assert rewards[:3] == [pytest.approx(math.exp(-1.5))] * 3
    assert rewards[3:5] == [0.0, 0.0] and rewards[5] == pytest.approx(math.exp(-2))
    assert penalty(completions, reader="ours") == [0.0, 0.0, 0.0, -1.0, -1.0, 0.0]
    # TimeLens2's reader (the default): JSON only; "0 to 1; 3 to 4" is prose to it
    rewards = twass(completions, [[0, 1]] * 6, duration=[20.0] * 6)
    assert rewards == [pytest.approx(math.exp(-1.5)), 0.0, pytest.approx(math.exp(-1.5)), 0.0, 0.0, 0.0]
    assert penalty(completions) == [0.0, -1.0, 0.0, -1.0, -1.0, -1.0]
    # beta from reward_kwargs, as the YAML gives it
    (bound,) = resolve_reward_funcs(["twass"], {"twass": {"beta": 3.0, "reader": "ours"}})
    assert bound(completions[5:], [[0, 1]], duration=[20.0]) == [pytest.approx(math.exp(-6))]
    assert bound.__name__ == "twass_reward"


@settings(max_examples=25, deadline=None)
@given(pred=span_set, truth=span_set)
def test_matches_an_independent_computation_on_random_sets(pred, truth):
    w1 = wasserstein1(pred, truth)
    # the grid's only error is where F_p - F_t changes sign inside a cell: at most |slope| * dx^2 / 4 each,
    # about 1e-7 here (slopes <= 8 per second, dx = 1/4000 s); a wrong formula is off by far more
    assert w1 == pytest.approx(grid_w1(pred, truth), rel=1e-6, abs=1e-5)
    assert twass_score(pred, truth) == pytest.approx(math.exp(-w1 / grid_union(truth)), rel=1e-9)
    union = math.exp(-w1 / grid_union(pred + truth))
    assert twass_score(pred, truth, normalizer="union") == pytest.approx(union, rel=1e-9)


@settings(max_examples=150, deadline=None)
@given(pred=span_set, truth=span_set, beta=st.sampled_from([0.5, 1.0, 3.0]))
def test_in_unit_interval_and_one_only_for_equal_sets(pred, truth, beta):
    score = twass_score(pred, truth, beta=beta)
    assert 0.0 < score <= 1.0
    assert (score == 1.0) == (covered_quarters(pred) == covered_quarters(truth))
    assert twass_score(truth, truth, beta=beta) == 1.0


@settings(max_examples=150, deadline=None)
@given(
    pred=span_set,
    truth=span_set,
    shift=st.integers(-40, 4000),
    cut=st.integers(0, 3),
    at=st.floats(0.01, 0.99),
)
def test_invariant_under_a_common_shift_and_under_splitting_into_touching_pieces(pred, truth, shift, cut, at):
    score = twass_score(pred, truth)
    moved = twass_score(
        [(s + shift / 4, e + shift / 4) for s, e in pred], [(s + shift / 4, e + shift / 4) for s, e in truth]
    )
    assert moved == pytest.approx(score, rel=1e-9)
    s, e = pred[cut % len(pred)]
    middle = s + at * (e - s)
    pieces = [span for i, span in enumerate(pred) if i != cut % len(pred)] + [(s, middle), (middle, e)]
    assert merge_spans(pieces) == merge_spans(pred)
    assert twass_score(pieces, truth) == score
    assert twass_score(truth, pieces) == twass_score(truth, pred)


@settings(max_examples=150, deadline=None)
@given(
    truth=span_set,
    length=st.integers(1, 40),
    near=st.integers(0, 300),
    further=st.integers(1, 300),
    right=st.booleans(),
)
def test_of_two_disjoint_predictions_the_nearer_gets_more(truth, length, near, further, right):
    """Two predictions of the same length on the same side of every true span, one ``further`` quarters
    further away: both score above 0, the nearer more. Within float64: exp(-W1/L) is 0.0 past W1/L of about 745
    (found by hypothesis: a 0.25 s truth and a 0.25 s prediction 186 s before it), so the gaps stay under 600
    quarters, which keeps W1/L under about 620 for the smallest truth (one quarter)."""
    lo, hi = min(s for s, _ in truth), max(e for _, e in truth)

    def placed(gap: int) -> list[tuple[float, float]]:
        if right:
            return [(hi + gap / 4, hi + (gap + length) / 4)]
        return [(lo - (gap + length) / 4, lo - gap / 4)]

    nearer, farther = twass_score(placed(near), truth), twass_score(placed(near + further), truth)
    assert 0.0 < farther < nearer < 1.0


def test_a_single_true_span_ranks_misses_by_distance_on_either_side():
    truth = [(10.0, 20.0)]
    scores = [twass_score([(10.0 + d, 20.0 + d)], truth) for d in (-30, -20, -12, 12, 20, 30)]
    assert scores[0] < scores[1] < scores[2] and scores[5] < scores[4] < scores[3]
    assert scores[0] == pytest.approx(scores[5]) and scores[2] == pytest.approx(scores[3])


def test_zero_length_spans():
    # beside a span of positive length a point carries no mass
    assert twass_score([(0, 1), (5, 5)], [(0, 1)]) == 1.0
    # a set of points only: the limit of ever shorter spans, equal mass on each distinct point
    assert wasserstein1([(5, 5), (5, 5)], [(0, 10)]) == pytest.approx(2.5)
    assert wasserstein1([(0, 0), (10, 10)], [(0, 10)]) == pytest.approx(2.5)  # half the mass at each end
    assert twass_score([(5, 5)], [(0, 10)]) == pytest.approx(
        twass_score([(5, 5.000001)], [(0, 10)]), rel=1e-6
    )
    assert (
        twass_score([(30, 30)], [(0, 10)])
        < twass_score([(12, 12)], [(0, 10)])
        < twass_score([(5, 5)], [(0, 10)])
    )
    # both sets points only: L = 0
    assert twass_score([(3, 3)], [(3, 3)]) == 1.0 and twass_score([(3, 3)], [(4, 4)]) == 0.0
    with pytest.raises(ValueError, match="start <= end"):
        twass_score([(2, 1)], [(0, 1)])
    with pytest.raises(ValueError, match="beta"):
        twass_score([(0, 1)], [(0, 1)], beta=0.0)


def test_reward_gives_disjoint_answers_nonzero_distance_ordered_rewards_where_iou_gives_none():
    truth = [10.0, 20.0]
    answers = [f"<think>x</think><answer>{s} to {s + 5}</answer>" for s in (22, 30, 45, 70)]
    answers.append("<answer>[[90, 95], [96, 99]]</answer>")
    answers.append("<answer>[[95, 110]]</answer>")  # clipped to the 100 s video: [95, 100]
    twass = REWARD_FUNCS["twass"](answers, [truth] * 6, duration=[100.0] * 6, reader="ours")
    iou = REWARD_FUNCS["iou"](answers, [truth] * 6, duration=[100.0] * 6)
    assert iou == [0.0] * 6
    assert all(r > 0 for r in twass) and twass[:5] == sorted(twass[:5], reverse=True)
    assert twass[5] == pytest.approx(twass_score([(95, 100)], [truth]))
    # several true spans: the solution may be a list
    multi = REWARD_FUNCS["twass"](
        ["<answer>[[0, 5], [20, 25]]</answer>"], [[[0, 5], [20, 25]]], duration=[100.0]
    )
    assert multi == [1.0]
    # TimeLens2's reader clips nothing: the same [95, 110] is scored as written
    (unclipped,) = REWARD_FUNCS["twass"](["[[95, 110]]"], [truth], duration=[100.0])
    assert unclipped == pytest.approx(twass_score([(95, 110)], [truth]))
    assert unclipped < twass[5]
