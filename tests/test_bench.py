"""`python -m video_grpo.bench perf --quick` runs end to end and its non-timing goals hold.

Timing results (step time, cache speed-up, data wait) are printed by the benchmark, not asserted here; the
cache's size and fidelity are."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.launch


def test_perf_quick():
    result = subprocess.run(
        [sys.executable, "-m", "video_grpo.bench", "perf", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # stdout is JSON lines only
    print("\n".join(json.dumps(line) for line in lines))
    for line in lines:
        assert {"name", "ours", "baseline", "ratio", "unit"} <= line.keys()
    names = [line["name"] for line in lines]
    assert names == [
        "vision_rows_per_step",
        "vision_rows_per_step",
        "step_time",
        "cache_bytes_per_sample",
        "sample_prep_cache_vs_decode",
        "sample_prep_cache_vs_decode",
        "cache_fidelity",
        "data_wait_fraction",
        "peak_memory_lora_beta",
        "lm_positions_per_forward",
        "train_step_time_shared_prefix",
        "peak_memory_shared_prefix",
        "generation_time_shared_prefill",
        "lm_positions_per_forward_qwen3_5",
        "train_step_time_shared_prefix_qwen3_5",
        "peak_memory_shared_prefix_qwen3_5",
        "decode_step_time_compiled_vs_eager",
        "decode_compile_time",
    ]
    assert [line["format"] for line in lines if line["name"] == "sample_prep_cache_vs_decode"] == [
        "raw",
        "jpeg",
    ]
    cache_bytes = next(line for line in lines if line["name"] == "cache_bytes_per_sample")
    assert cache_bytes["ratio"] <= 1 / 8
    fidelity = next(line for line in lines if line["name"] == "cache_fidelity")
    assert fidelity["ours"] >= 38 and [q["quality"] for q in fidelity["by_quality"]] == [80, 90, 95]
    rows = {line["setting"]: line["ratio"] for line in lines if line["name"] == "vision_rows_per_step"}
    assert rows["trainable"] <= 1 / 8 * 1.05 and rows["frozen"] <= 1 / 24 * 1.05
    memory = next(line for line in lines if line["name"] == "peak_memory_lora_beta")
    assert memory["parameters"] >= 100_000_000 and memory["ratio"] <= 1.15
    # the shared prompt: the loss forward carries (P + sum C) positions, not G x (P + C_max)
    positions = next(line for line in lines if line["name"] == "lm_positions_per_forward")
    assert positions["ratio"] <= positions["ideal"] * 1.05 and positions["G"] == 8
    assert next(line for line in lines if line["name"] == "generation_time_shared_prefill")["same_tokens"]
    # Qwen3.5: the packed forward forks the Gated DeltaNet state, and carries (P + sum C) positions too
    positions = next(line for line in lines if line["name"] == "lm_positions_per_forward_qwen3_5")
    assert positions["state_forked"] and positions["ratio"] <= positions["ideal"] * 1.05
    # the compiled decode step: the same tokens, every timed step through one graph
    decode = next(line for line in lines if line["name"] == "decode_step_time_compiled_vs_eager")
    assert decode["same_tokens"] and decode["graphs"] == 1 and decode["compiled_steps"] > 0


def test_gpu_benchmark_script_smoke_runs_on_cpu():
    result = subprocess.run(
        [
            sys.executable,
            "scripts/bench_gpu.py",
            "--tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--steps",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    line = lines["gpu_train_samples_per_s"]
    assert line["ours"] > 0 and line["baseline"] > 0
    # the planner's prediction for the same step, printed beside the measured peak on CUDA
    planned = lines["gpu_peak_memory_planned"]
    assert 0 < planned["ours"] <= planned["baseline"]


def test_shared_prompt_gpu_entry_smoke_runs_on_cpu():
    """``scripts/bench_gpu.sh``'s shared-prompt lines, at tiny widths on the CPU."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "video_grpo.bench.shared_prefix",
            "gpu",
            "--widths",
            "quick",
            "--visual_tokens",
            "256",
            "--G",
            "4",
            "--device",
            "cpu",
            "--dtype",
            "float32",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["name"] for line in lines] == [
        "lm_positions_per_forward",
        "train_step_time_shared_prefix",
        "peak_memory_shared_prefix",
        "generation_time_shared_prefill",
    ]
    assert all(line["ours"] > 0 and line["baseline"] > 0 for line in lines)


def test_attention_kernel_entry_smoke_runs_on_cpu():
    """``scripts/bench_gpu.sh``'s SDPA-kernel line, at tiny widths on the CPU: it names the kernel the packed
    forward ran and its peak; the memory-efficient kernel does not exist on the CPU, and the row says so."""
    from video_grpo.bench.sdpa_kernel import sdpa_kernel_rows

    lines = []
    sdpa_kernel_rows(lambda *args, **extra: lines.append((args, extra)), "quick", 256, 4, "cpu", "float32")
    (name, ours, baseline, _), extra = lines[0]
    assert name == "packed_attention_kernel_peak_memory" and ours is None and baseline > 0
    assert any("scaled_dot_product" in kernel for kernel in extra["kernels"]["default"]["kernels"])
    assert "No viable backend" in extra["kernels"]["efficient"]["error"]


@pytest.mark.parametrize("widths", ["3b", "7b"])
def test_literal_widths_match_the_published_configs(widths):
    """bench.qwen_widths' literal widths (used by bench perf, scripts/bench_gpu.py and test_real_widths when
    ../shared/reference is absent) are the published config.json's."""
    from video_grpo.bench.qwen_widths import REFERENCE_FILES, published_config

    if not REFERENCE_FILES[widths].is_file():
        pytest.skip(f"{REFERENCE_FILES[widths]} is absent")
    published, origin = published_config(widths)
    literal, literal_origin = published_config(widths, reference=False)
    assert origin.endswith("config.json") and literal_origin == "literal"
    keys = [k for k in literal if k not in ("vision_config", "rope_scaling", "model_type")]
    assert {k: literal[k] for k in keys} == {k: published[k] for k in keys}
    assert literal["rope_scaling"]["mrope_section"] == published["rope_scaling"]["mrope_section"]
    vision = literal["vision_config"]
    assert vision == {k: published["vision_config"][k] for k in vision}
