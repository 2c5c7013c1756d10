"""The full-depth shared-prompt rows (``video_grpo.bench.shared_prefix_depth``) extrapolate a 1 + 1 step by its
layers' measured costs. The memory rule is checked here against a deeper step measured outright, at narrow widths:
live tensor bytes are deterministic, so a wrong rule (a layer's saved bytes missed, the peak taken at the wrong
moment) fails. Time has no unit test (timings live in benchmarks); the hooks that time a layer must fire once
each per step, which measure_side checks itself."""

from __future__ import annotations

import pytest

from video_grpo.bench.shared_prefix_depth import full_depth, measure_side


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "plain"])
def test_the_memory_of_a_deeper_step_is_the_extrapolated_one(shared):
    setting = {"widths": "quick", "visual_tokens": 512, "G": 4, "shared": shared}
    one = measure_side(setting)
    deeper = measure_side({**setting, "text_layers": 3, "vision_layers": 2})
    _, predicted = full_depth(one, 3, 2)
    measured = deeper["memory"]["peak"]
    assert one["memory"]["text"] > 0 and one["memory"]["vision"] > 0
    assert abs(predicted / measured - 1) < 0.005, (predicted, measured, one["memory"], deeper["memory"])
    assert one["time"]["text"] > 0 and one["time"]["vision"] > 0 and one["time"]["step"] > one["time"]["text"]
