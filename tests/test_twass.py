"""TimeLens2's temporal Wasserstein reward (`twass`) and `parse_penalty`: hand-computed values, the formula
against an independent numerical computation, and the properties the issue asks for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from video_grpo.rewards import REWARD_FUNCS, resolve_reward_funcs, twass_score
from video_grpo.span_sets import wasserstein1


def _grid(spans_sets, cells: int = 400_000):
    """Cell edges over every span, and cell midpoints: the grid for the checks below."""
    lo = min(s for spans in spans_sets for s, _ in spans)
    hi = max(e for spans in spans_sets for _, e in spans)
    edges = np.linspace(lo, hi, cells + 1)
    return edges, 0.5 * (edges[1:] + edges[:-1])


def _inside(spans, mids):
    inside = np.zeros_like(mids, dtype=bool)
    for s, e in spans:
        inside |= (mids >= s) & (mids <= e)
    return inside


def grid_w1(pred, truth) -> float:
    """W1 as the integral of |F_p - F_t| on a fine grid, each CDF the running integral of its set's indicator:
    independent of the module's merging and quantile formula. Positive-length spans only."""
    edges, mids = _grid([pred, truth])

    def cdf(spans):
        mass = np.concatenate([[0.0], np.cumsum(_inside(spans, mids))])
        return mass / mass[-1]

    return float(np.trapezoid(np.abs(cdf(pred) - cdf(truth)), edges))


def grid_union(spans) -> float:
    """Measure of the union of ``spans`` on the same kind of grid."""
    edges, mids = _grid([spans])
    return float(_inside(spans, mids).sum() * (edges[1] - edges[0]))


def test_hand_computed_values():
    assert wasserstein1([(0, 1)], [(2, 3)]) == pytest.approx(2.0)  # a shift moves all mass by 2
    assert wasserstein1([(0, 2)], [(0, 1)]) == pytest.approx(0.5)  # |2u - u| over [0, 1]
    assert wasserstein1([(5, 5)], [(0, 10)]) == pytest.approx(2.5)  # a point: E|X - 5| for X ~ U[0, 10]
    assert twass_score([(0, 1)], [(2, 3)]) == pytest.approx(math.exp(-2 / 2))
    assert twass_score([(0, 1)], [(2, 3)], beta=3.0) == pytest.approx(math.exp(-3 * 2 / 2))
    # two predicted spans against one: W1 = 1/8 + 11/8, L = 2
    assert twass_score([(0, 1), (3, 4)], [(0, 1)]) == pytest.approx(math.exp(-1.5 / 2))
    assert twass_score([(0, 1)], [(0, 1)]) == 1.0
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
    expected = math.exp(-w1 / grid_union(pred + truth))
    assert twass_score(pred, truth) == pytest.approx(expected, rel=1e-4)


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
    rewards = twass(completions, [[0, 1]] * 6, duration=[20.0] * 6)
    assert rewards[:3] == [pytest.approx(math.exp(-0.75))] * 3
    assert rewards[3:5] == [0.0, 0.0] and rewards[5] == pytest.approx(math.exp(-1))
    assert penalty(completions) == [0.0, 0.0, 0.0, -1.0, -1.0, 0.0]
    # beta from reward_kwargs, as the YAML gives it
    (bound,) = resolve_reward_funcs(["twass"], {"twass": {"beta": 3.0}})
    assert bound(completions[5:], [[0, 1]], duration=[20.0]) == [pytest.approx(math.exp(-3))]
    assert bound.__name__ == "twass_reward"
