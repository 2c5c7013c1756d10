"""Evaluation: the metric rules on hand-computed cases, kill-and-resume, sharding, plots, eval in training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from PIL import Image

from video_grpo.data.dataset import build_dataset
from video_grpo.evaluate import parse_prediction, score_records

from .conftest import REPO, SAMPLES
from .launch_entry import ended_in_order
from .test_launch import CPU_ENV, two_process_launcher
from .test_trainer import SAMPLING, make_trainer

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def rec(output, solution, duration=30.0):
    return {"output": output, "solution": solution, "duration": duration}


def test_metric_rules_on_hand_computed_cases():
    records = [
        rec("<think>x</think><answer>0 to 10</answer>", [5, 15]),  # IoU 5/15 = 0.333
        rec("<answer>10 to 20</answer>", [10, 20]),  # 1.0
        rec("<answer>2 to 8</answer>", [0, 10]),  # 0.6
        rec("the event is from 4 to 9 seconds", [4, 9]),  # no answer block: last span in text, 1.0
        rec("<answer>9 to 3</answer>", [3, 9]),  # S > E: failure, IoU 0, kept in denominator
        rec("no idea", [1, 2]),  # failure
        rec("<answer>25 to 40</answer>", [20, 30], duration=30.0),  # no clamping: 5 / 20 = 0.25
        rec("<answer>5 to 5</answer>", [5, 5]),  # empty union: 0, never 1
    ]
    metrics = score_records(records)
    ious = [1 / 3, 1.0, 0.6, 1.0, 0.0, 0.0, 0.25, 0.0]
    assert metrics["num_queries"] == 8 and metrics["num_parse_failures"] == 2
    assert metrics["R1@0.3"] == pytest.approx(100 * 4 / 8)
    assert metrics["R1@0.5"] == pytest.approx(100 * 3 / 8)
    assert metrics["R1@0.7"] == pytest.approx(100 * 2 / 8)
    assert metrics["mIoU"] == pytest.approx(100 * sum(ious) / 8)
    assert score_records([rec("<answer>3 to 6</answer>", [3, 6.0])])["R1@0.7"] == 100.0  # >= m, not > m
    assert parse_prediction("<answer>1 to 2</answer> then 5 to 9") == (1, 2)  # the answer block wins
    assert (
        parse_prediction("<answer>later</answer> 5 to 9") is None
    )  # a block without a span does not fall back


def test_multi_window_and_duration_buckets():
    metrics = score_records(
        [
            rec("<answer>4 to 6</answer>", [[0, 2], [4, 6]], 20.0),
            rec("<answer>0 to 50</answer>", [0, 100], 150.0),
        ]
    )
    assert metrics["R1@0.7"] == 50.0
    assert (
        metrics["by_duration"]["0-30s"]["mIoU"] == 100.0 and metrics["by_duration"][">=120s"]["mIoU"] == 50.0
    )


def test_score_cli(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(rec("<answer>0 to 10</answer>", [0, 10])) + "\n")
    out = tmp_path / "m.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "video_grpo.evaluate",
            "score",
            "--predictions",
            str(path),
            "--output",
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    assert json.loads(out.read_text())["R1@0.5"] == 100.0


def run_eval(
    model_dir, out_dir, *extra, launcher=(sys.executable, "-m"), env=ENV, config="configs/grpo/demo_tiny.yaml"
):
    cmd = [
        *launcher,
        "video_grpo.evaluate",
        "run",
        "--model_name_or_path",
        str(model_dir),
        "--config",
        str(config),
        "--split",
        "train",
        "--output_dir",
        str(out_dir),
        "--batch_size",
        "1",
        "--max_new_tokens",
        "24",
        *extra,
    ]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    return out


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_ref")
    finish(run_eval(tiny_model_dir, out))
    return out


def test_run_writes_predictions_and_metrics(reference_run):
    lines = [json.loads(line) for line in (reference_run / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in lines] == [
        json.loads(x)["id"] for x in (SAMPLES / "train.jsonl").read_text().splitlines()
    ]
    for r in lines:
        assert set(r) >= {"id", "video", "sentence", "duration", "solution", "output", "span", "iou"}
    metrics = json.loads((reference_run / "metrics.json").read_text())
    assert metrics["num_queries"] == 16
    assert metrics == score_records(lines)  # `score` on the file reproduces `run`


def test_a_recipes_scoring_and_decoding_reach_the_run(tiny_model_dir, reference_run, tmp_path):
    """The recipe's span_scoring and eval_generation_kwargs drive ``evaluate run``: TimeLens2's decoding (sampling at
    top_k 1) gives the reference run's greedy answers, scored the timelens way; --max_new_tokens on the command line
    (24) wins over the recipe's 4096."""
    import yaml

    from video_grpo.evaluate import scored_span

    recipe = yaml.safe_load((REPO / "configs" / "grpo" / "demo_tiny.yaml").read_text())
    generation = {"do_sample": True, "temperature": 0.01, "top_p": 0.001, "top_k": 1, "max_new_tokens": 4096}
    recipe.update(span_scoring="timelens", eval_generation_kwargs=generation)
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe))
    out = finish(run_eval(tiny_model_dir, tmp_path / "out", "--max_samples", "3", config=config))
    settings = json.loads(next(line for line in out.splitlines() if line.startswith("evaluate run: "))[14:])
    assert settings == {"span_scoring": "timelens", "reader": "ours", **generation, "max_new_tokens": 24}
    lines = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    reference = [json.loads(line) for line in (reference_run / "predictions.jsonl").read_text().splitlines()][
        :3
    ]
    assert [r["output"] for r in lines] == [r["output"] for r in reference]
    assert all(r["span"] == scored_span(r["output"], "timelens") for r in lines)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics == score_records(lines, "timelens") and metrics["span_scoring"] == "timelens"


def test_killed_run_resumes_to_the_same_metrics(tiny_model_dir, reference_run, tmp_path):
    proc = run_eval(tiny_model_dir, tmp_path)
    part = tmp_path / "predictions.rank0.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not part.exists() or part.read_text().count("\n") < 3):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = part.read_text().count("\n")
    assert 3 <= done_before < 16, "the kill should land part-way"
    out = finish(run_eval(tiny_model_dir, tmp_path))
    assert f"({done_before} done before)" in out
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(
        (reference_run / "metrics.json").read_text()
    )
    assert (tmp_path / "predictions.jsonl").read_text() == (reference_run / "predictions.jsonl").read_text()


def test_sharded_over_two_processes_matches_one(tiny_model_dir, reference_run, tmp_path):
    ends = tmp_path / "ends"
    launcher = two_process_launcher("tests/launch_entry.py", "--record", str(ends))
    finish(run_eval(tiny_model_dir, tmp_path, launcher=launcher, env=CPU_ENV))
    assert (tmp_path / "predictions.jsonl").read_text() == (reference_run / "predictions.jsonl").read_text()
    assert not list(tmp_path.glob("predictions.rank*.jsonl"))
    assert [end["returned"] for end in ended_in_order(ends)] == [0, 0]


def test_plots(reference_run, tmp_path):
    from video_grpo.plot import plot_timeline, plot_train

    timeline = plot_timeline(reference_run / "predictions.jsonl", tmp_path / "timeline.png", num=6)
    run_dir = tmp_path / "run" / "checkpoint-2"  # an in-progress run has only checkpoint folders
    run_dir.mkdir(parents=True)
    history = [
        {
            "step": s,
            "loss": 0.1,
            "reward": 0.1 * s,
            "rewards/iou_reward/mean": 0.05 * s,
            "kl": 0.01,
            "completions/mean_length": 40 + s,
            "learning_rate": 1e-6,
        }
        for s in (1, 2)
    ]
    (run_dir / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": history}))
    curves = plot_train(tmp_path / "run", tmp_path / "curves.png")
    for path in (timeline, curves):
        image = Image.open(path)
        assert image.width > 400 and image.height > 300
        assert len(set(image.convert("L").getdata())) > 20  # drawn, not blank
    assert path.stat().st_size > 10_000


def test_eval_during_training_logs_r1_and_miou(tiny_model_dir, train_file, tmp_path):
    train = build_dataset(train_file, sampling=SAMPLING)
    evaluation = build_dataset(SAMPLES / "test.jsonl", sampling=SAMPLING)
    trainer = make_trainer(
        tiny_model_dir,
        train,
        tmp_path,
        eval_dataset=evaluation,
        trainer_kwargs={"grounding_eval_samples": 4},
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=2,
    )
    trainer.train()
    logged = [e for e in trainer.state.log_history if "eval_R1@0.5" in e]
    assert logged and "eval_mIoU" in logged[0] and logged[0]["eval_num_parse_failures"] <= 4


def checkpointing_settings(model) -> list[dict]:
    """The keyword arguments each checkpointed module will call torch's checkpoint with."""
    return [
        dict(module._gradient_checkpointing_func.keywords)
        for module in model.modules()
        if getattr(module, "gradient_checkpointing", False)
    ]


def test_evaluation_keeps_the_checkpointing_settings(tiny_model_dir, train_file, tmp_path):
    """Generation unwraps the model and turns checkpointing back on afterwards: with the run's settings
    (PEFT + ZeRO-3 needs use_reentrant=True), not transformers' defaults."""
    train = build_dataset(train_file, sampling=SAMPLING)
    evaluation = build_dataset(SAMPLES / "test.jsonl", sampling=SAMPLING)
    trainer = make_trainer(
        tiny_model_dir,
        train,
        tmp_path,
        eval_dataset=evaluation,
        trainer_kwargs={"grounding_eval_samples": 2},
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": True},
        per_device_eval_batch_size=2,
        max_steps=1,
    )
    trainer.model.gradient_checkpointing_enable(
        trainer.args.gradient_checkpointing_kwargs
    )  # as training does
    before = checkpointing_settings(trainer.model)
    assert before and all(settings == {"use_reentrant": True} for settings in before)
    metrics = trainer.evaluate()
    assert "eval_mIoU" in metrics
    assert checkpointing_settings(trainer.model) == before


def test_a_bad_video_is_reported_not_replaced(tiny_model_dir, tmp_path):
    import shutil

    videos = tmp_path / "videos"
    videos.mkdir()
    rows = [json.loads(line) for line in (SAMPLES / "test.jsonl").read_text().splitlines()][:2]
    shutil.copy(SAMPLES / rows[0]["video"], videos / "good.mp4")
    (videos / "broken.mp4").write_text("not a video")
    rows[0]["video"], rows[1]["video"] = "videos/good.mp4", "videos/broken.mp4"
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    finish(run_eval(tiny_model_dir, out, "--annotations", str(tmp_path / "a.jsonl")))
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["id"] for p in predictions] == [rows[0]["id"], rows[1]["id"]]
    assert "error" not in predictions[0] and "broken.mp4" in predictions[1]["error"]
    assert predictions[1]["iou"] == 0.0 and json.loads((out / "metrics.json").read_text())["num_queries"] == 2
