"""Scale recipes, each exercised: ZeRO-3 offload, a frozen vision tower in-process, and the GPU/multi-node configs.

LoRA (trained, saved and merged) and the frozen tower are launched under ZeRO-3 in ``tests/test_zero3_bf16.py``."""

from __future__ import annotations

import subprocess

import pytest
import torch
import yaml

from .conftest import REPO
from .launch_entry import ended_in_order
from .test_launch import ENV, GUIDED, changed, check_trained_run, free_port, launch, launch_command, load


@pytest.mark.launch
def test_zero3_offload_runs_on_cpu(tiny_model_dir, tmp_path):
    out = tmp_path / "offload"
    result = launch("cpu/zero3_offload.yaml", tiny_model_dir, out)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert (
        "zero_stage=3" in log and "Adam Optimizer #0 is created" in log
    )  # DeepSpeedCPUAdam: optimizer offloaded
    assert changed(load(tiny_model_dir), load(out), "vision")


@pytest.mark.parametrize(
    ("name", "processes", "machines", "stage", "offload"),
    [
        ("zero1.yaml", 8, 1, 1, "none"),
        ("zero2.yaml", 8, 1, 2, "none"),
        ("zero3.yaml", 8, 1, 3, "none"),
        ("zero3_offload.yaml", 8, 1, 3, "cpu"),
        ("multi_node_zero3.yaml", 16, 2, 3, "none"),
    ],
)
def test_gpu_configs_are_valid_accelerate_configs(name, processes, machines, stage, offload):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(REPO / "configs" / "accelerate" / name))
    assert str(config.distributed_type).endswith("DEEPSPEED")
    assert config.num_processes == processes and config.num_machines == machines
    assert config.deepspeed_config["zero_stage"] == stage
    assert config.deepspeed_config["offload_optimizer_device"] == offload
    assert str(config.mixed_precision).removeprefix("PrecisionType.").lower() == "bf16" and not config.use_cpu
    if stage == 3:
        assert config.deepspeed_config["zero3_save_16bit_model"] is True


@pytest.mark.parametrize(
    "name", ["zero1.yaml", "zero2.yaml", "zero3.yaml", "zero3_offload.yaml", "multi_node_zero3.yaml"]
)
def test_every_gpu_config_has_a_cpu_twin_that_differs_only_in_device_and_process_count(name):
    """The launched tests run the twins (cpu/<name>), so they run the DeepSpeed stage, offload and bf16 users run."""
    from accelerate.commands.config.config_args import load_config_from_file

    folder = REPO / "configs" / "accelerate"
    gpu, twin = (yaml.safe_load(path.read_text()) for path in (folder / name, folder / "cpu" / name))
    assert {key for key in gpu.keys() | twin.keys() if gpu.get(key) != twin.get(key)} == {
        "use_cpu",
        "num_processes",
    }
    assert twin["use_cpu"] is True and twin["num_processes"] == 2 and twin["mixed_precision"] == "bf16"
    load_config_from_file(str(folder / "cpu" / name))  # and accelerate accepts it
    launched = "\n".join(path.read_text() for path in (REPO / "tests").glob("test_*.py"))
    assert f'"cpu/{name}"' in launched, f"no launched test runs cpu/{name}"


@pytest.mark.launch
def test_multi_node_twin_trains_on_two_nodes(tiny_model_dir, tmp_path):
    """Two `accelerate launch` "nodes" (machine_rank 0 and 1) on this machine, one process each, ZeRO-3, bf16, with
    ground-truth-guided groups of 8 over the 2 ranks of 4 rows (each group spans both nodes): the launch also holds
    every check of tests/test_launch.py's training launches (check_trained_run), which ran it on cpu/zero3.yaml
    before (one launch fewer; the ZeRO-3 stage, bf16 and the 2 ranks are the same)."""
    out, port = tmp_path / "run", free_port()
    nodes = [
        subprocess.Popen(
            launch_command(
                "cpu/multi_node_zero3.yaml",
                tiny_model_dir,
                out,
                *GUIDED,
                launcher=(
                    "--machine_rank",
                    str(rank),
                    "--main_process_ip",
                    "127.0.0.1",
                    "--main_process_port",
                    str(port),
                ),
                entry=("tests/launch_entry.py", "--record", str(tmp_path / "ends"), "video_grpo.grpo"),
            ),
            cwd=REPO,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    logs = [node.communicate(timeout=900)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "distributed_type=DEEPSPEED num_processes=2 zero_stage=3" in logs[0]
    check_trained_run(out, logs[0] + logs[1], tiny_model_dir, 3, GUIDED)
    ended_in_order(tmp_path / "ends")  # each rank left main with the process group torn down


def test_slurm_script_is_valid_bash_and_uses_the_multi_node_config():
    script = REPO / "scripts" / "slurm" / "train.slurm"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "configs/accelerate/multi_node_zero3.yaml" in text
    assert "--machine_rank" in text and "--main_process_ip" in text


def test_frozen_vision_tower_in_process(tiny_model_dir, train_file, tmp_path):
    from video_grpo.data.dataset import build_dataset

    from .test_trainer import SAMPLING, make_trainer, vision_snapshot

    trainer = make_trainer(
        tiny_model_dir,
        build_dataset(train_file, sampling=SAMPLING),
        tmp_path,
        trainer_kwargs={"freeze_vision_tower": True},
    )
    before = vision_snapshot(trainer.model)
    trainer.train()
    assert all(torch.equal(before[n], p) for n, p in trainer.model.model.visual.named_parameters())
