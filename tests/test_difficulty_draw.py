"""TimeLens's difficulty draw (video_grpo.data.difficulty_draw) and `curate --rule gaussian`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from video_grpo.curate import main
from video_grpo.data.difficulty_draw import gaussian_draw, gaussian_weights

from .conftest import SAMPLES
from .test_curate import HAND, write


def test_weights_are_the_gaussian_times_the_inverse_bin_count():
    # 180 queries in bin [0.05, 0.10), 20 in [0.20, 0.25): the Gaussian alone favours the crowded bin, the
    # inverse density turns that round, per query
    ious = [0.07] * 180 + [0.22] * 20
    p = gaussian_weights(ious)
    gauss = lambda x: math.exp(-0.5 * ((x - 0.05) / 0.2) ** 2)  # noqa: E731
    assert p[0] / p[-1] == pytest.approx(
        (gauss(0.07) / 180) / (gauss(0.22) / 20), rel=1e-6
    )  # the +1e-6 in the count
    assert p.sum() == pytest.approx(1.0) and p[-1] > p[0]
    # IoU 1.0 shares the last bin [0.95, 1] with 0.97 (2 queries there), 0.5 is alone in its bin
    last = gaussian_weights([1.0, 0.97, 0.5])
    assert last[0] / last[1] == pytest.approx(gauss(1.0) / gauss(0.97), rel=1e-6)  # the +1e-6 in the count
    assert last[2] / last[1] == pytest.approx(
        (gauss(0.5) / 1) / (gauss(0.97) / 2), rel=1e-6
    )  # the +1e-6 in the count


def test_seed_and_target_size():
    rng = np.random.default_rng(0)
    ious = rng.uniform(0, 1, 1000).tolist()
    a, b = gaussian_draw(ious, 250, seed=42), gaussian_draw(ious, 250, seed=42)
    assert a == b and len(a) == 250 and len(set(a)) == 250 and a == sorted(a)  # no repeats; file order
    assert gaussian_draw(ious, 250, seed=43) != a
    assert len(gaussian_draw(ious, 5000, seed=42)) == 1000  # a target above the pool takes all of it
    with pytest.raises(ValueError, match="target_size"):
        gaussian_draw(ious, 0)


def test_low_iou_queries_are_favoured():
    # as many queries at every IoU (uniform): the draw's IoUs must sit well below the pool's
    rng = np.random.default_rng(1)
    ious = np.array(rng.uniform(0, 1, 2000))
    drawn = ious[gaussian_draw(ious.tolist(), 300, seed=42)]
    assert drawn.mean() < 0.25 < ious.mean()
    assert (drawn < 0.25).sum() > 4 * (drawn > 0.5).sum()


def test_curate_cli_gaussian_rule(tmp_path, capsys):
    predictions = write(
        tmp_path / "p.jsonl", HAND
    )  # mean IoUs: hard 0, mid 0.583, easy 1, low 0.05, multi 0.667
    args = ["--predictions", str(predictions), "--video_root", str(SAMPLES)]
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert (
            main([*args, "--output_dir", str(out), "--rule", "gaussian", "--target_size", "3", "--seed", "7"])
            == 0
        )
        runs.append(out)
    per_query = [json.loads(x) for x in (runs[0] / "per_query.jsonl").read_text().splitlines()]
    statuses = {q["id"]: q["status"] for q in per_query}
    assert sorted(statuses.values()) == ["kept"] * 3 + ["not_drawn"] * 2
    assert (runs[0] / "curated.jsonl").read_text() == (runs[1] / "curated.jsonl").read_text()  # seeded
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert (summary["rule"], summary["kept"], summary["not_drawn"], summary["target_size"]) == (
        "gaussian",
        3,
        2,
        3,
    )
    expected = [i for i in gaussian_draw([q["mean_iou"] for q in per_query], 3, seed=7)]
    assert [q["id"] for q in per_query if q["status"] == "kept"] == [per_query[i]["id"] for i in expected]
    assert (runs[0] / "mean_iou_hist.png").stat().st_size > 1000
    assert "kept (drawn)            3" in capsys.readouterr().out
