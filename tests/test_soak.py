"""``python -m video_grpo.bench soak`` (video_grpo.bench.soak): the compiled case for a few steps, in this process.

What is checked is that the rows are made and their counts are read from the run (graphs, compiled steps, hooks,
sizes), not timings or memory slopes, which only mean something over hundreds of steps."""

from __future__ import annotations

import pytest
import torch

from video_grpo.bench.soak import SoakSettings, case_rows, exit_code, run_case, slope_per_100

STEPS = 6


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_soak_rows_read_the_run(tiny_model_dir, fresh_dynamo):
    settings = SoakSettings(steps=STEPS, warmup=1, sample_every=4, backend="aot_eager")
    result = run_case(tiny_model_dir, settings, compiled=True)
    rows = case_rows(result, settings)
    names = [row["name"] for row in rows]
    assert names[:7] == [
        "soak_step_time_drift",
        "soak_rss_growth",
        "soak_tensor_growth",
        "soak_decode_graphs",
        "soak_decode_fallbacks",
        "soak_compiled_steps",
        "soak_input_grad_hooks",
    ]
    assert all({"goal", "met", "case"} <= row.keys() for row in rows)
    by_name = {row["name"]: row for row in rows}
    assert len(result["record"]["step_seconds"]) == STEPS
    assert by_name["soak_decode_graphs"]["ours"] == 1 and by_name["soak_decode_graphs"]["met"]
    assert by_name["soak_compiled_steps"]["ours"] == by_name["soak_compiled_steps"]["baseline"] == STEPS
    # one hook on the text embeddings and one on the vision patch embedding, after the first step and the last
    assert by_name["soak_input_grad_hooks"]["ours"] == by_name["soak_input_grad_hooks"]["baseline"] == 2
    sizes = {row["size"]: row for row in rows if row["name"] == "soak_growth"}
    assert (
        sizes["trainer.state.log_history entries"]["ours"]
        - sizes["trainer.state.log_history entries"]["baseline"]
        == STEPS - 2
    )  # logged after steps 2..11 (step 12's entry comes after its callback)
    assert sizes["trainer._metrics[train] values"]["met"], sizes["trainer._metrics[train] values"]
    assert result["record"]["tensor_steps"] == [2, 4, 6]
    assert all(value > 0 for value in result["record"]["tensor_bytes"])


def test_the_slope_is_per_100_steps():
    assert slope_per_100([10, 20, 30], [5.0, 6.0, 7.0]) == pytest.approx(10.0)
    assert slope_per_100([10], [5.0]) == 0.0


def test_check_exits_1_on_a_missed_goal_only():
    rows = [{"met": True}, {"met": None}]
    assert exit_code(rows, check=True) == 0
    assert exit_code([*rows, {"met": False}], check=True) == 1
    assert exit_code([*rows, {"met": False}], check=False) == 0
