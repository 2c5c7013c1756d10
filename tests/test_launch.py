"""Real multi-process runs: ``accelerate launch`` of the entry point on 2 CPU processes under DeepSpeed."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText

from .conftest import REPO, SAMPLES

pytestmark = pytest.mark.launch
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(
    accelerate_config: str,
    tiny_model_dir: Path,
    output_dir: Path,
    *extra: str,
    recipe: str = "configs/grpo/demo_tiny.yaml",
    entry: tuple[str, ...] = ("-m", "video_grpo.grpo"),
    launcher: tuple[str, ...] = (),
    log_level: str = "info",
    cli: bool = False,
) -> list[str]:
    """``accelerate launch`` of the entry point on a CPU twin of a GPU config (``cpu/zero3.yaml``...), in bf16
    as the twins and the GPU recipes are.

    ``cli``: through the ``accelerate`` command, whose dispatcher imports every subcommand's module (``estimate``
    imports transformers: 4.4 CPU s before it launches anything, on this machine); otherwise through its ``launch``
    module (``python -m accelerate.commands.launch``: 2.4 s), which parses the same arguments with the same parser
    and calls the same ``launch_command``. test_accelerate_launch_trains_and_saves[zero2] runs the command users
    type; the other launches save the 2 CPU s."""
    launcher_command = (
        [str(Path(sys.executable).with_name("accelerate")), "launch"]
        if cli
        else [sys.executable, "-m", "accelerate.commands.launch"]
    )
    return [
        *launcher_command,
        "--config_file",
        f"configs/accelerate/{accelerate_config}",
        *(launcher or ("--main_process_port", str(free_port()))),
        *entry,
        "--config",
        recipe,
        "--model_name_or_path",
        str(tiny_model_dir),
        "--output_dir",
        str(output_dir),
        "--max_steps",
        "2",
        "--log_level",
        log_level,
        "--bf16",
        "true",
        # a reward that always varies within a group: every step has gradients, so "weights moved" is certain
        "--reward_funcs",
        "iou",
        "format",
        "tests.launch_rewards:length_reward",
        *extra,
    ]


def two_process_launcher(*entry: str) -> tuple[str, ...]:
    """torchrun of 2 CPU processes without DeepSpeed (evaluation, curation), then ``entry``; run it with
    :data:`CPU_ENV`. (``accelerate launch --cpu`` starts one process unless mpirun is installed.)"""
    return (
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        *entry,
    )


CPU_ENV = {**ENV, "ACCELERATE_USE_CPU": "true"}  # what accelerate launch sets for use_cpu: true


def launch(*args, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """:func:`launch_command` run to its end; ``env``: added to :data:`ENV` for this launch."""
    return subprocess.run(
        launch_command(*args, **kwargs),
        cwd=REPO,
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )


def load(path) -> dict[str, torch.Tensor]:
    model, info = AutoModelForImageTextToText.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.state_dict()


def changed(initial: dict, trained: dict, part: str) -> bool:
    """Whether any weight of ``part`` differs, compared in the saved dtype: a bf16 run saves bf16 weights, and the
    rounding of an unchanged fp32 weight is not a change."""
    names = [n for n in initial if (".visual." in n) == (part == "vision")]
    assert names
    return any(not torch.equal(trained[n], initial[n].to(trained[n].dtype)) for n in names)


def mixed_dataset(folder, good: int, bad_kinds: list[str]):
    """``good`` real videos plus truncated / empty / non-video files, as a JSONL annotation file."""
    videos = folder / "videos"
    videos.mkdir(parents=True)
    rows = [json.loads(line) for line in (SAMPLES / "train.jsonl").read_text().splitlines()][:good]
    for row in rows:
        shutil.copy(SAMPLES / row["video"], videos / os.path.basename(row["video"]))
        row["video"] = os.path.basename(row["video"])
    for i, kind in enumerate(bad_kinds):
        path = videos / f"bad_{kind}_{i}.mp4"
        if kind == "truncated":
            path.write_bytes((SAMPLES / "videos" / "train_000.mp4").read_bytes()[:1500])
        elif kind == "empty":
            path.write_bytes(b"")
        else:
            path.write_text("this is not a video\n" * 50)
        rows.append({**rows[0], "id": f"bad_{i}", "video": path.name})
    annotations = folder / "train.jsonl"
    annotations.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return annotations, videos


# ZeRO-3 also runs ground-truth-guided groups of 8 over 2 ranks of 4 rows: each group spans both ranks. The two-node
# twin runs them (tests/test_scale.py), its ranks on two "nodes".
GUIDED = (
    "--gt_guidance",
    "true",
    "--advantage_shaping",
    "tempsamp",
    "--per_device_train_batch_size",
    "4",
    "--num_generations",
    "8",
)

# The Qwen3-VL ZeRO-3 run fits itself, each rank to another budget (tests/launch_budgets.py: rank R's
# auto_fit_memory_gb, as on cards of different memory): 1.3 GB for rank 0, where its plan fits as it is (1.191 GB
# planned), and 1.15 GB for rank 1, under it (1.144 GB with the micro-batch halved, 1.158 GB with checkpointing
# alone). Each plan holds ZeRO-3's 1 GB gradient reduce bucket (video_grpo.plan.deepspeed_buffers). Both ranks must apply the one fit for the smallest, rank 1's (a rank that kept its micro-batch would make
# other collective calls than one that halved it, and hang).
AUTO_FIT = ("--auto_fit", "true")
BUDGETS = "1.3,1.15"


# The ZeRO-2 run checks its plan (video_grpo.runtime.memory_check) on rank 0, in live tensor bytes: under DeepSpeed the
# optimizer row is the engine's own step, inside the backward (accelerate's optimizer.step() does nothing there).
PLAN_CHECK = ("--plan_check", "true")

# ... and trains on 4 good videos and 3 bad ones (truncated, empty, text; tests/test_fault_tolerance.py's theme): 2
# ranks x 8 rows in groups of 4 draw 4 of the 7 queries a step, so 2 steps draw a bad one unless both draws miss
# all 3 (1 in 35 each; the seed is fixed). Every bad video drawn is replaced by a good query, and the run goes on.
BAD_VIDEOS = ("--max_bad_sample_fraction", "0.9", "--num_generations", "4")


@pytest.mark.parametrize(
    ("config", "stage", "extra", "family"),
    [
        ("cpu/zero2.yaml", 2, PLAN_CHECK, "qwen2_5_vl"),
        ("cpu/zero3.yaml", 3, AUTO_FIT, "qwen3_vl"),
        ("cpu/zero3.yaml", 3, (), "qwen3_5"),
    ],
    ids=["zero2", "zero3-qwen3_vl", "zero3-qwen3_5"],
)
def test_accelerate_launch_trains_and_saves(family_model, tmp_path, config, stage, extra, family):
    """The ZeRO-2 launch also trains on bad videos (BAD_VIDEOS), which had a launch of their own. ZeRO-3 with
    ground-truth-guided groups (GUIDED) is launched on the two-node twin, with these same checks:
    tests/test_scale.py::test_multi_node_twin_trains_on_two_nodes (one launch fewer each)."""
    out = tmp_path / "run"
    tiny_model_dir = family_model(family)
    recipe = f"configs/grpo/{'demo_tiny' if family == 'qwen2_5_vl' else 'tiny_' + family}.yaml"
    entry = ("tests/launch_budgets.py", BUDGETS) if extra == AUTO_FIT else ("-m", "video_grpo.grpo")
    data = ()
    if extra == PLAN_CHECK:
        annotations, videos = mixed_dataset(
            tmp_path / "data", good=4, bad_kinds=["truncated", "empty", "text"]
        )
        data = ("--train_file", str(annotations), "--video_root", str(videos), *BAD_VIDEOS)
    cli = extra == PLAN_CHECK  # one launch through the `accelerate` command itself (launch_command)
    # The ZeRO-2 launch JIT-builds into an empty extensions folder: DeepSpeed's CPU shm comm op must not be built
    # there (video_grpo.runtime.deepspeed_imports.skip_cpu_shm_comm_build; without it this launch builds it, 85 CPU s)
    extensions = tmp_path / "torch_extensions"
    env = {"TORCH_EXTENSIONS_DIR": str(extensions)} if cli else None
    result = launch(config, tiny_model_dir, out, *extra, *data, recipe=recipe, entry=entry, cli=cli, env=env)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    check_trained_run(out, log, tiny_model_dir, stage, extra)
    if cli:
        assert not (extensions / "deepspeed_shm_comm").exists(), sorted(extensions.iterdir())
    if data:
        # bad videos were drawn, each replaced (with its reason logged) and counted, and the run finished
        assert "replaced a bad sample" in log
        assert any(f"bad_{kind}" in log for kind in ("truncated_0", "empty_1", "text_2"))
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        assert max(entry.get("data/bad_samples", 0) for entry in history) >= 1


def check_trained_run(out: Path, log: str, tiny_model_dir: Path, stage: int, extra: tuple[str, ...]) -> None:
    """What every 2-rank training launch must show (the output folder, the ranks' joint log), and what its
    ``extra`` arguments are for."""
    assert f"distributed_type=DEEPSPEED num_processes=2 zero_stage={stage}" in log
    assert "plan: peak" in log and "per GPU in" in log  # the planner's summary, before the model loaded
    # The saved model reloads completely (no missing or random-initialised weights), as full tensors.
    initial, trained = load(tiny_model_dir), load(out)
    assert all(trained[name].shape == tensor.shape for name, tensor in initial.items())
    assert changed(initial, trained, "vision"), "vision tower did not train"
    assert (out / "trainer_state.json").is_file()
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    if extra == AUTO_FIT:
        record = json.loads((out / "auto_fit.json").read_text())
        assert record["changes"] and record["planned_peak_gb_after"] < record["planned_peak_gb_before"], (
            record
        )
        # the micro-batch halved with the generation and optimizer batches kept; both ranks ran it to the end (a
        # rank that had kept 8 rows would run one forward per step where the other runs two: other collective calls)
        assert record["after"] == {
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "steps_per_generation": 2,
        }, record
        assert record["generation_rows_per_process"] == record["rows_per_optimizer_step_per_process"] == 8, (
            record
        )
        assert "auto_fit.json: " in log
        # one fit for both ranks, rank 1's budget's: each budget alone gives another fit (so the test can fail),
        # and each rank applied the fit the smaller budget gives alone
        fits = [json.loads((out / f"fit.rank{rank}.json").read_text()) for rank in (0, 1)]
        assert [fit["budget_gb"] for fit in fits] == [1.3, 1.15], fits
        assert fits[0]["alone"] == {} and fits[1]["alone"] == record["after"], fits
        assert fits[0]["applied"] == fits[1]["applied"] == {**fits[1]["before"], **fits[1]["alone"]}, fits
        assert record["device_memory_gb"] == 1.15, record
        assert record["ranks"] == {
            "processes": 2,
            "rule": "every rank fits for the smallest device among the ranks",
            "fitted_for_rank": 1,
            "memory_gb_by_rank": [1.3, 1.15],
        }, record
        assert "fitted for the smallest device among 2 ranks (rank 1's, 1.15 GB" in log
    elif extra == PLAN_CHECK:
        check_deepspeed_plan_check(json.loads((out / "plan_check.json").read_text()), initial, log)
    elif extra == GUIDED:  # every group had its guided answer: the metric is logged for each step
        assert len([e for e in history if "guidance/groups_all_sampled_negative" in e]) == 2
    # shared_prefix is on by default in every family (Qwen3.5: its Gated DeltaNet state forked), with no warning:
    # the loss forwards packed, and each rank prefilled one row per prompt of its generation batch
    ratios = [e["shared_prefix/position_ratio"] for e in history if "shared_prefix/position_ratio" in e]
    prefills = [e["shared_prefix/prefill_ratio"] for e in history if "shared_prefix/prefill_ratio" in e]
    assert "shared_prefix is off" not in log and "runs the plain forward" not in log
    assert len(ratios) == 2 and all(0 < r < 1 for r in ratios), history
    assert prefills and all(0 < r < 1 for r in prefills), history
    assert not list(out.glob("*.bin")) or [p.name for p in out.glob("*.bin")] == ["training_args.bin"]


def check_deepspeed_plan_check(record: dict, initial: dict[str, torch.Tensor], log: str) -> None:
    """Rank 0's plan check under ZeRO-2, bf16, 2 ranks, against what the model's size says (P parameters): the
    optimizer window is the engine's step, which allocates while it makes the rank's float32 gradient partition
    (4 bytes x P/2; a window around accelerate's no-op adds nothing), with the bf16 weights (2P) and the rank's float32 master weights and
    Adam moments (12 x P/2) alive; the loss window holds DeepSpeed's gradient bucket (reduce_bucket_size, 5e8 bf16
    elements by default: 1 GB), which the backward allocates and the plan counts (video_grpo.plan.deepspeed_buffers):
    without it the loss phase is planned at 0.17 of its measure, with it twice in float32 at 1.95; it measured
    0.99 (those three figures, and the step's 0.59 / 0.195 MB below, were measured when this launch trained on the
    recipe's own data with G = 8, before it took the bad videos and G = 4)."""
    params = sum(t.numel() for t in {t.data_ptr(): t for t in initial.values()}.values())
    assert record["deepspeed"] and record["step"] == 2 and record["dropped"] == {}, record
    assert "_take_model_step" in record["optimizer_window"]
    optimizer, loss = record["phases"]["optimizer"], record["phases"]["loss"]
    # the step's allocations: a window around accelerate's no-op adds 0 bytes; the engine's step added 0.59 MB in most
    # runs but 0.195 MB in one of five (DeepSpeed frees some of its own as it allocates the float32 partition of
    # 0.40 MB), so the bound is a quarter of that partition
    assert optimizer["added_gb"] * 1e9 >= 4 * params / 2 / 4, (params, optimizer)
    assert optimizer["at_start_gb"] * 1e9 >= 2 * params + 12 * params / 2, (params, optimizer)
    assert loss["added_gb"] * 1e9 >= 5e8 * 2, loss
    planned_loss = record["planned_bytes_by_category"]["loss"]
    assert planned_loss["deepspeed buffers"] == 5e8 * 2, planned_loss
    assert 0.9 <= loss["ratio"] <= 1.1, loss
    assert f"plan check: optimizer: planned {optimizer['planned_gb']:.4g} GB" in log
