"""Real multi-process runs: ``accelerate launch`` of the entry point on 2 CPU processes under DeepSpeed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText

from .conftest import REPO

pytestmark = pytest.mark.launch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(accelerate_config: str, tiny_model_dir: Path, output_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--config_file", f"configs/accelerate/{accelerate_config}",
           "--main_process_port", str(free_port()), "-m", "video_grpo.grpo",
           "--config", "configs/grpo/demo_tiny.yaml", "--model_name_or_path", str(tiny_model_dir),
           "--output_dir", str(output_dir), "--max_steps", "2", "--log_level", "info", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(("config", "stage"), [("cpu_zero2.yaml", 2), ("cpu_zero3.yaml", 3)])
def test_accelerate_launch_trains_and_saves(tiny_model_dir, tmp_path, config, stage):
    out = tmp_path / "run"
    result = launch(config, tiny_model_dir, out)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert f"distributed_type=DEEPSPEED num_processes=2 zero_stage={stage}" in log
    # The saved model reloads completely (no missing or random-initialised weights), as full tensors.
    saved, info = AutoModelForImageTextToText.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    initial = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).state_dict()
    trained = saved.state_dict()
    assert all(trained[name].shape == tensor.shape for name, tensor in initial.items())
    vision = [name for name in initial if ".visual." in name]
    assert vision and any(not torch.equal(trained[n], initial[n]) for n in vision), "vision tower did not train"
    assert (out / "trainer_state.json").is_file()
