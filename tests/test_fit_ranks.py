"""One auto-fit for every rank (``video_grpo.plan.ranks``): the device all ranks fit for, and the check that they
chose alike. The real two-rank run, whose ranks see different budgets, fit for the smaller alike and train, is
tests/test_launch.py's ``zero3-qwen3_vl`` launch (``tests/launch_budgets.py``)."""

from __future__ import annotations

import pytest

from video_grpo.plan import ranks
from video_grpo.plan.ranks import RankDevices, check_agreement
from video_grpo.plan.recipe import resolve_gpu


def test_every_rank_fits_for_the_smallest_device():
    big, small = resolve_gpu(None, 80), resolve_gpu(None, 40)
    devices = RankDevices([big, small, big, dict(small)], rank=2)
    assert devices.chosen == 1 and devices.gpu == small  # the least memory; the lowest rank among equals
    assert devices.as_json() == {
        "processes": 4,
        "rule": "every rank fits for the smallest device among the ranks",
        "fitted_for_rank": 1,
        "memory_gb_by_rank": [80, 40, 80, 40],
    }
    assert devices.words().startswith("fitted for the smallest device among 4 ranks (rank 1's, 40 GB")
    assert RankDevices([big]).words() == ""  # one process: nothing to say
    # a rank without a device (a CPU run without auto_fit_memory_gb): no device for any, so every rank stops alike
    assert RankDevices([big, None]).gpu is None


def test_ranks_that_chose_differently_stop_with_their_choices(monkeypatch):
    monkeypatch.setattr(
        ranks, "all_gather", lambda choice: [choice, (True, {"per_device_train_batch_size": 4})]
    )
    check_agreement((True, {"per_device_train_batch_size": 4}), "auto_fit")
    with pytest.raises(RuntimeError, match=r"auto_fit: the ranks chose differently .*rank 0: \(True, \{\}\)"):
        check_agreement((True, {}), "auto_fit")
