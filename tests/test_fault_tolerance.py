"""Losing a sample, never a run: bad videos mid-training, the bad-sample cap, kill -9 and resume,
config errors before any model loads, and the security defaults.

Bad videos replaced in a real two-process run: the ZeRO-2 launch of tests/test_launch.py trains on
:func:`~tests.test_launch.mixed_dataset` and asserts it (it had a launch of its own here, one launch more)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
import yaml

from video_grpo.data.annotations import AnnotationError, load_annotations
from video_grpo.data.dataset import build_dataset, set_replacement_weights
from video_grpo.data.sample_weights import mean_reward_weights
from video_grpo.evaluate import parse_prediction
from video_grpo.rewards.functions import REWARD_FUNCS
from video_grpo.runtime.checkpoints import is_complete, last_complete_checkpoint

from .conftest import REPO, SAMPLES
from .test_launch import ENV, launch_command, mixed_dataset
from .test_trainer import SAMPLING, make_trainer


def test_too_many_bad_samples_stop_the_run_with_a_clear_message(tiny_model_dir, tmp_path):
    annotations, videos = mixed_dataset(tmp_path, good=2, bad_kinds=["empty", "text"] * 3)
    dataset = build_dataset(annotations, video_root=videos, sampling=SAMPLING)
    trainer = make_trainer(
        tiny_model_dir, dataset, tmp_path, max_steps=20, trainer_kwargs={"max_bad_sample_fraction": 0.1}
    )
    with pytest.raises(RuntimeError, match=r"max_bad_sample_fraction=0.1.*video_grpo.data check"):
        trainer.train()


def test_replacement_is_deterministic_and_shared_by_repeats(tmp_path):
    annotations, videos = mixed_dataset(tmp_path, good=3, bad_kinds=["empty"])
    dataset = build_dataset(annotations, video_root=videos, sampling=SAMPLING)
    bad = list(dataset.with_format(None)["id"]).index("bad_0")
    rows = dataset.__getitems__([bad, bad, 0])
    again = dataset.__getitems__([bad])
    assert rows[0]["bad_sample"] and "file is empty" in rows[0]["bad_sample"]
    assert rows[0]["id"] == rows[1]["id"] == again[0]["id"] != "bad_0"
    assert rows[0]["video_frames"] is rows[1]["video_frames"]
    assert rows[2]["bad_sample"] is None


def test_a_replaced_row_keeps_the_index_drawn_and_is_replaced_by_the_draw_weights(tmp_path):
    """A bad video's row becomes another row (every column, row_index and id included), but drawn_row_index keeps
    the row the sampler drew. Without draw weights the replacement is uniform, as before; with them it is drawn by
    the weights, deterministically from the drawn row (the same for each repeat)."""
    annotations, videos = mixed_dataset(tmp_path, good=3, bad_kinds=["empty"])
    dataset = build_dataset(annotations, video_root=videos, sampling=SAMPLING)
    ids = list(dataset.with_format(None)["id"])
    bad = ids.index("bad_0")
    rows = dataset.__getitems__([bad, bad, 0])
    assert rows[0]["drawn_row_index"] == rows[1]["drawn_row_index"] == bad and rows[2]["drawn_row_index"] == 0
    assert rows[0]["row_index"] != bad and rows[0]["id"] == ids[rows[0]["row_index"]] != "bad_0"
    transform = dataset.format["format_kwargs"]["transform"]
    uniform = [transform.replacement_candidates(seed)[0] for seed in range(4000)]
    assert sorted(set(uniform)) == [0, 1, 2, 3]
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    set_replacement_weights(dataset, p)
    firsts = torch.tensor([transform.replacement_candidates(seed)[0] for seed in range(4000)])
    share = torch.bincount(firsts, minlength=4).double() / len(firsts)
    assert ((share - p).abs() < 5 * (p * (1 - p) / len(firsts)).sqrt()).all(), share
    set_replacement_weights(dataset, torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64) + 1e-12)
    again = dataset.__getitems__([bad, bad])
    assert again[0]["id"] == again[1]["id"] == ids[2] and again[0]["drawn_row_index"] == bad


def test_the_logged_relative_weight_is_the_drawn_querys(tiny_model_dir, tmp_path):
    """sample_weight/relative_weight is N p of the query the sampler drew, also when its video was bad and another
    query trained in its place (it used to log the replacement's weight)."""
    annotations, videos = mixed_dataset(tmp_path, good=3, bad_kinds=["empty"])
    dataset = build_dataset(annotations, video_root=videos, sampling=SAMPLING)
    p = mean_reward_weights([1.0, 1.0, 1.0, 0.0], 2)  # bad_0 (row 3) comes first; the others weigh 1e-16
    trainer = make_trainer(
        tiny_model_dir,
        dataset,
        tmp_path,
        per_device_train_batch_size=2,
        num_generations=2,
        trainer_kwargs={"sample_weights": p},
    )
    seen = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        seen.extend((x["id"], x["drawn_row_index"]) for x in inputs)
        return original(inputs)

    trainer._generate_and_score_completions = spy
    trainer.train()
    assert {drawn for _, drawn in seen} == {3} and "bad_0" not in {query for query, _ in seen}
    relative = [
        h["sample_weight/relative_weight"]
        for h in trainer.state.log_history
        if "sample_weight/relative_weight" in h
    ]
    assert relative == pytest.approx([4 * float(p[3])], rel=1e-6)


def recorded_steps(folder, ranks: int = 2) -> dict[int, list[str]]:
    """``step -> ids`` trained at that step (rank 0's rows, then rank 1's) from ``tests.launch_rewards:record_ids``;
    a step that not every rank recorded before a kill is left out."""
    per_rank = []
    for rank in range(ranks):
        path = folder / f"ids.rank{rank}.jsonl"
        steps = {}
        for line in path.read_text().splitlines() if path.exists() else []:
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by the kill
                record = json.loads(line)
                steps[record["step"]] = record["ids"]
        per_rank.append(steps)
    common = set.intersection(*(set(steps) for steps in per_rank))
    return {step: [i for steps in per_rank for i in steps[step]] for step in sorted(common)}


@pytest.mark.launch
@pytest.mark.parametrize("config", ["cpu/zero2.yaml", "cpu/zero3.yaml"])
def test_kill_and_resume(tiny_model_dir, tmp_path, config):
    """kill -9 in the third epoch, then the same command resumes from the last complete checkpoint. With TimeLens2's
    draw weights over epochs of 2 steps (4 queries, 2 prompts a step), the resumed run trains at each step the
    queries the killed run trained there before the kill: from checkpoint-3 it continues epoch 1's order after the
    batch already trained, then orders epoch 2 as the first process did, instead of replaying epoch 0's order."""
    out, killed, resumed = tmp_path / "run", tmp_path / "ids_killed", tmp_path / "ids_resumed"
    killed.mkdir()
    resumed.mkdir()
    train_ids = [json.loads(line)["id"] for line in (SAMPLES / "train.jsonl").read_text().splitlines()][:4]
    weights = tmp_path / "per_query.jsonl"
    weights.write_text(
        "".join(
            json.dumps({"id": i, "k": 8, "mean_iou": m}) + "\n"
            for i, m in zip(train_ids, (0.1, 0.5, 0.3, 0.1), strict=True)
        )
    )
    extra = (
        "--max_steps",
        "6",  # the end of the third epoch: the resumed run trains steps 4 to 6, the rest of epoch 1 and epoch 2
        "--save_strategy",
        "steps",
        "--save_steps",
        "3",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_train_samples",
        "4",
        "--sample_weight_mean_power",
        "2",
        "--sample_weight_file",
        str(weights),
        "--reward_funcs",
        "iou",
        "format",
        "tests.launch_rewards:length_reward",
        "tests.launch_rewards:record_ids",
    )
    cmd = launch_command(config, tiny_model_dir, out, *extra)
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**ENV, "VIDEO_GRPO_RECORD_IDS": str(killed)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 600
    while time.time() < deadline and 5 not in recorded_steps(killed):  # step 5: epoch 2, after checkpoint-3
        assert proc.poll() is None, "the run ended before its fifth step"
        time.sleep(0.05)
    family = psutil.Process(proc.pid).children(recursive=True)  # the launcher and every training process
    os.killpg(proc.pid, signal.SIGKILL)
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    proc.wait()
    psutil.wait_procs(family, timeout=30)
    assert not (out / "trainer_state.json").exists(), "the kill should land before the run finished"
    resumed_from = last_complete_checkpoint(out)
    assert os.path.basename(resumed_from or "") == "checkpoint-3"  # mid-epoch 1: one batch to skip
    # A checkpoint that was being written when the kill landed: newer, but incomplete.
    half = out / "checkpoint-5"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"\0" * 100)
    assert not is_complete(half)

    # Rerun the same command, at the default log level: the resume must still say where it resumes from, once.
    result = subprocess.run(
        launch_command(config, tiny_model_dir, out, *extra, log_level="passive"),
        cwd=REPO,
        env={**ENV, "VIDEO_GRPO_RECORD_IDS": str(resumed)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert log.count(f"resuming training at {resumed_from}") == 1, [
        x for x in log.splitlines() if "heckpoint" in x
    ]
    assert "skipping" in log and "checkpoint-5: incomplete" in log
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6

    before, after = recorded_steps(killed), recorded_steps(resumed)
    assert list(after) == [4, 5, 6], after
    for epoch in (0, 1):  # each epoch of the uninterrupted run trains every query once (without replacement)
        assert sorted(set(before[2 * epoch + 1] + before[2 * epoch + 2])) == sorted(train_ids), before
    # the orders differ between epochs (seed 42 and these weights), so a resume replaying epoch 0's order would show:
    assert before[4] != before[2] and before[5] != before[3], before
    overlap = [step for step in after if step in before]
    assert overlap[:2] == [4, 5], (before, after)
    assert {step: after[step] for step in overlap} == {step: before[step] for step in overlap}


def write_recipe(tmp_path, **fields) -> str:
    recipe = {
        "model_name_or_path": "unused/model",
        "train_file": str(SAMPLES / "train.jsonl"),
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "bf16": False,
        **fields,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"train_file": "missing.jsonl"}, r"train_file: 'missing.jsonl' does not exist"),
        ({"eval_file": "nope.jsonl"}, r"eval_file: 'nope.jsonl' does not exist"),
        ({"video_root": "/no/such/dir"}, r"video_root: '/no/such/dir' is not a directory"),
        ({"reward_funcs": ["iou", "fromat"]}, r"unknown reward 'fromat'. Known rewards: format, format_soft"),
        ({"dataset_format": "csv"}, r"dataset_format: unknown format 'csv'"),
        (
            {"video_min_pixels": 100000, "video_max_pixels": 50000},
            r"video_min_pixels: .* is above video_max_pixels",
        ),
        ({"per_device_train_batch_size": 3, "num_generations": 2}, r"divisible by num_generations"),
        ({"train_file": str(REPO / "README.md")}, r"cannot tell the annotation format"),
        ({"eval_strategy": "steps"}, r"eval_strategy: is 'steps' but eval_file is not set"),
        ({"max_bad_sample_fraction": 2}, r"max_bad_sample_fraction: must be in \[0, 1\]"),
        ({"use_vllm": True}, r"use_vllm: vLLM rollouts do not support video here yet"),
        ({"report_to": ["wandb"]}, r"report_to: 'wandb' needs the 'wandb' package"),
    ],
)
def test_config_errors_fail_before_any_model_loads(tmp_path, monkeypatch, fields, message):
    """The real entry point, in-process; loading a model would fail the test."""
    import video_grpo.grpo as entry

    def no_model_loading(*args, **kwargs):
        raise AssertionError("a model or processor was loaded before the config error was raised")

    monkeypatch.setattr(entry.AutoProcessor, "from_pretrained", no_model_loading)
    monkeypatch.setattr(entry, "VideoGRPOTrainer", no_model_loading)
    with pytest.raises(ValueError, match=message):
        entry.main(*entry.parse_args(["--config", write_recipe(tmp_path, **fields)]))


def test_decode_compile_true_under_zero3_without_gathering_fails_before_the_model_loads(
    tmp_path, monkeypatch
):
    """The launch's ZeRO stage, from the environment accelerate gives its processes: ZeRO-3 without
    ds3_gather_for_generation cannot compile the decode step, so decode_compile: true is refused before loading."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    # parse_args would patch DeepSpeed's comm module for the rest of this worker (skip_cpu_shm_comm_build)
    monkeypatch.setenv("VIDEO_GRPO_CPU_SHM_COMM", "1")
    recipe = write_recipe(tmp_path, decode_compile="true", ds3_gather_for_generation=False)
    import video_grpo.grpo as entry

    def no_model_loading(*args, **kwargs):
        raise AssertionError("a model or processor was loaded before the config error was raised")

    monkeypatch.setattr(entry.AutoProcessor, "from_pretrained", no_model_loading)
    monkeypatch.setattr(entry, "VideoGRPOTrainer", no_model_loading)
    with pytest.raises(
        ValueError, match=r"decode_compile: true, but ZeRO-3 without ds3_gather_for_generation"
    ):
        entry.main(*entry.parse_args(["--config", recipe]))
    from video_grpo.configs import check_decode_launch

    monkeypatch.delenv("ACCELERATE_DEEPSPEED_ZERO_STAGE")  # a launch with deepspeed_config_file sets no stage
    ds_config = tmp_path / "ds.json"
    ds_config.write_text('{"zero_optimization": {"stage": 3}}')
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(ds_config))
    with pytest.raises(
        ValueError, match=r"decode_compile: true, but ZeRO-3 without ds3_gather_for_generation"
    ):
        check_decode_launch(*entry.parse_args(["--config", recipe])[:2])
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")  # ZeRO-2 holds whole weights: no error here
    check_decode_launch(*entry.parse_args(["--config", recipe])[:2])


@pytest.mark.parametrize(
    ("family", "message"),
    [
        (
            "qwen2_5_vl",
            r"video_max_frames: 512 frames can never fit .* at most 128 frames fit \(qwen2_5_vl\)",
        ),
        ("qwen3_vl", r"video_max_frames: 512 frames can never fit .* at most 170 frames fit \(qwen3_vl\)"),
    ],
)
def test_video_budget_is_checked_with_the_model_family_before_the_model_loads(
    tmp_path, monkeypatch, family, message
):
    """A frame's token cost depends on the family (28x28 or 32x32 px), read from the model's config.json only."""
    import video_grpo.grpo as entry
    from video_grpo.toys.tiny import build_tiny_model

    def no_model_loading(*args, **kwargs):
        raise AssertionError("a model or processor was loaded before the config error was raised")

    model = build_tiny_model(tmp_path / family, family=family)
    monkeypatch.setattr(entry.AutoProcessor, "from_pretrained", no_model_loading)
    monkeypatch.setattr(entry, "VideoGRPOTrainer", no_model_loading)
    recipe = write_recipe(
        tmp_path,
        model_name_or_path=str(model),
        video_max_frames=512,
        video_max_tokens=256,
        video_min_pixels=3136,
    )
    with pytest.raises(ValueError, match=message):
        entry.main(*entry.parse_args(["--config", recipe]))


def test_unsupported_model_type_fails_with_the_supported_list(tmp_path):
    from transformers import LlavaConfig

    from video_grpo.configs import validate_recipe
    from video_grpo.grpo import parse_args

    LlavaConfig().save_pretrained(tmp_path / "llava")
    args = parse_args(["--config", write_recipe(tmp_path, model_name_or_path=str(tmp_path / "llava"))])
    with pytest.raises(
        ValueError,
        match=r"unsupported model type 'llava': video_grpo supports qwen2_5_vl, qwen3_5, "
        r"qwen3_vl",
    ):
        validate_recipe(*args)


def test_config_error_from_the_command_line(tmp_path):
    recipe = write_recipe(tmp_path, train_file="missing.jsonl")
    result = subprocess.run(
        [sys.executable, "-m", "video_grpo.grpo", "--config", recipe],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "train_file: 'missing.jsonl' does not exist" in result.stderr
    assert "Loading weights" not in result.stderr + result.stdout


def test_video_paths_cannot_escape_video_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.mp4").write_bytes(b"x")
    for video in ("../secret.mp4", str(tmp_path / "secret.mp4")):
        path = tmp_path / "a.jsonl"
        path.write_text(
            json.dumps({"id": "a", "video": video, "duration": 9, "solution": [1, 2], "sentence": "s"}) + "\n"
        )
        with pytest.raises(AnnotationError, match="outside video_root.*allow_absolute_video_paths"):
            load_annotations(path, video_root=root)
        records, _ = load_annotations(path, video_root=root, allow_absolute_video_paths=True)
        assert records[0]["video"] == str((tmp_path / "secret.mp4").resolve())


def test_security_defaults(tmp_path):
    from trl import GRPOConfig

    assert GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False).trust_remote_code is False
    for recipe in (REPO / "configs" / "grpo").glob("*.yaml"):
        assert "trust_remote_code" not in recipe.read_text()
    marker = tmp_path / "pwned"
    payload = f"<answer>__import__('os').system('touch {marker}') to 5</answer>"
    assert parse_prediction(payload) is None
    for func in REWARD_FUNCS.values():
        func(completions=[payload], solution=[[1, 2]], duration=[10])
    assert not marker.exists()  # model output is parsed as text, never evaluated
