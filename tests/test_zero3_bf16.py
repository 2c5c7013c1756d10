"""What the GPU recipes really run: DeepSpeed ZeRO-3, bf16, 2 ranks, a frozen vision tower, a reference model,
evaluation during training, on clips whose ``second_per_grid_ts`` is just below 1 (bf16 would round it to 1.0).

One real ``accelerate launch`` of the entry point (``tests/launch_probe.py`` wraps it with observers only) on
the bf16 CPU twin of ``configs/accelerate/zero3.yaml``. Each rank reports what it saw; the test asserts:

- every forward after generation (old policy, reference, loss) gives each prompt the 3-D positions
  generation gave it, and the same ``second_per_grid_ts`` (float32 on both sides);
- the frozen tower runs exactly once per generation batch, on each rank;
- an evaluation with uneven shards (3 queries, 2 ranks, batch size 1) finishes;
- generation decodes through the compiled step (``decode_compile``, traced with the cheap ``eager`` backend) under
  ZeRO-3 on every rank, and the gathered weights do not keep their addresses from one generation call to the next
  (why the step is compiled without CUDA graphs under ZeRO-3: ``video_grpo.rollout.decode.decode_settings``);
- the saved model's vision tower is unchanged and its language model trained.

A second launch runs LoRA with gradient checkpointing and beta > 0 under ZeRO-3: an evaluation between steps, the
adapter-off reference, the saved adapter and its merge into the base.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from safetensors.torch import load_file

from .conftest import REPO
from .launch_entry import ended_in_order
from .test_launch import ENV, changed, launch_command, load
from .test_video_formats import ffmpeg

pytestmark = pytest.mark.launch

# Whole-second clips at 29.97 fps, one frame short of the last whole second: sampled at 2 fps, their frames are
# 0.4997 s apart, so second_per_grid_ts is 0.9993-0.9995, which bf16 rounds to 1.0.
CLIPS = {"clip16": 479, "clip20": 599, "clip30": 898}


def write_task(folder):
    videos = folder / "videos"
    videos.mkdir(parents=True)
    for name, frames in CLIPS.items():
        ffmpeg(
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=64x64:rate=30000/1001",
            "-frames:v",
            str(frames),
            "-c:v",
            "libx264",
            "-pix_fmt",
            "yuv420p",
            str(videos / f"{name}.mp4"),
        )
    # 8 queries: one generation batch of 2 ranks x 4 prompts; some videos hold several queries
    rows = [
        ("clip16", [2, 9]),
        ("clip20", [4, 12]),
        ("clip20", [10, 15]),
        ("clip30", [5, 20]),
        ("clip16", [8, 14]),
        ("clip30", [1, 6]),
        ("clip20", [0, 5]),
        ("clip30", [20, 29]),
    ]
    train = [
        {
            "id": f"q{i}",
            "video": f"{name}.mp4",
            "duration": round(CLIPS[name] / 29.97, 3),
            "solution": span,
            "sentence": "a red circle moves across the screen",
        }
        for i, (name, span) in enumerate(rows)
    ]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (folder / "eval.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in train[:3])
    )  # 3 queries on 2 ranks
    return folder / "train.jsonl", folder / "eval.jsonl", videos


@pytest.fixture(scope="module")
def clip_task(tmp_path_factory):
    """The clips and their queries, encoded once for the module's three launches (libx264 took about 3 CPU s a
    test); the runs only read them."""
    return write_task(tmp_path_factory.mktemp("clips"))


def test_zero3_bf16_frozen_tower_time_encoder_and_uneven_eval(tiny_model_dir, tmp_path, clip_task):
    train, evaluation, videos = clip_task
    out = tmp_path / "run"
    cmd = launch_command(
        "cpu/zero3.yaml",
        tiny_model_dir,
        out,
        "--train_file",
        str(train),
        "--eval_file",
        str(evaluation),
        "--video_root",
        str(videos),
        "--video_fps",
        "2",
        "--video_max_frames",
        "64",
        "--video_min_pixels",
        "784",
        "--video_max_pixels",
        "3136",
        "--video_max_tokens",
        "1024",
        "--freeze_vision_tower",
        "true",
        "--beta",
        "0.04",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        "--steps_per_generation",
        "2",
        "--max_completion_length",
        "16",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "1",
        "--per_device_eval_batch_size",
        "1",
        "--eval_grounding_samples",
        "3",
        "--decode_compile",
        "true",
        "--decode_compile_backend",
        "eager",
        entry=("tests/launch_probe.py",),
    )
    result = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    assert "zero_stage=3" in log
    assert "the compiled decode step failed" not in log, log[-6000:]
    # the static cache sized from the recipe before the model loaded, as the planner sizes it (not at a call)
    assert (
        "decode_compile: compiled (eager, graph breaks allowed (ZeRO-3" in log
        and "the first call positions" not in log
    ), log[-6000:]
    assert "could not size the static cache" not in log, log[-6000:]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    decoded = [entry["decode/compiled"] for entry in history if "decode/compiled" in entry]
    assert decoded and all(value == 1.0 for value in decoded), history
    probes = [json.loads((out / f"probe.rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, probe in enumerate(probes):
        print(rank, {k: v for k, v in probe.items() if k not in ("generation_seconds", "later_seconds")})
        assert probe["dtypes"].get("vision_tower:torch.bfloat16"), probe["dtypes"]  # the run is really bf16
        seconds = probe["generation_seconds"]
        assert seconds and all(0.998 < s < 1.0 for s in seconds), seconds  # the clips do what they are for
        assert set(probe["later_seconds"]) <= set(seconds)
        assert not any("bfloat16" in key for key in probe["dtypes"] if "second_per_grid_ts" in key), probe[
            "dtypes"
        ]
        assert probe["rows_compared"] >= 8 and probe["rows_differing"] == 0, probe
        # ... with shared_prefix on (the default): the positions compared above are the packed rows' prompts
        packed = probe["shared_prefix"]
        assert packed["on"] and 0 < packed["packed_positions"] < packed["plain_positions"], packed
        # Training: one generation batch (steps_per_generation 2, max_steps 2), one run of the frozen tower.
        assert probe["generation_batches"]["train"] == 1
        assert probe["encoder_runs"]["train"] == probe["generation_batches"]["train"], probe
        # Evaluation after each step finished on both ranks, with grounding metrics. Its tower runs: one per eval
        # generation batch, and one per grounding batch (2 per evaluation: the 1-query shard is padded to 2).
        assert len(probe["eval_metrics"]) == 2 and all("eval_mIoU" in m for m in probe["eval_metrics"])
        assert probe["encoder_runs"]["eval"] == probe["generation_batches"]["eval"] + 2 * 2, probe
        # Every generation call (1 training, 2 evaluations x (2 sampled + 2 greedy grounding batches)) decoded
        # through the compiled step; graphs: train mode, eval mode sampled (1 row), eval mode greedy (padded to 8)
        calls = len(probe["weight_pointers"])
        assert probe["decode"]["calls"] == calls and probe["decode"]["fallbacks"] == 0, probe["decode"]
        assert probe["decode"]["compiled_steps"] >= calls and probe["decode"]["graphs"] == 3, probe["decode"]
        # ZeRO-3 gathers the weights for generation into buffers allocated anew: their addresses move between calls
        assert len({tuple(pointers) for pointers in probe["weight_pointers"]}) > 1
    assert probes[0]["encoder_runs"] == probes[1]["encoder_runs"]
    ended_in_order(out)  # both ranks left main with the process group torn down
    initial, trained = load(tiny_model_dir), load(out)  # the frozen tower stayed, the language model trained
    assert not changed(initial, trained, "vision") and changed(initial, trained, "language")


def clip_task_args(task) -> list[str]:
    """Data and video arguments for the clips whose second_per_grid_ts bf16 would round to 1.0 (``clip_task``)."""
    train, evaluation, videos = task
    return [
        *("--train_file", str(train), "--eval_file", str(evaluation), "--video_root", str(videos)),
        *("--video_fps", "2", "--video_max_frames", "64", "--video_min_pixels", "784"),
        *("--video_max_pixels", "3136", "--video_max_tokens", "1024"),
    ]


def test_sft_cold_start_sees_the_sampled_time_in_float32(tiny_model_dir, tmp_path, clip_task):
    """The SFT cold start under ZeRO-3 bf16: the model receives second_per_grid_ts exactly as sampled, in
    float32 (DeepSpeed's input cast would make 0.9993 a bf16 1.0, one time position off per frame pair)."""
    out = tmp_path / "sft"
    cmd = launch_command(
        "cpu/zero3.yaml",
        tiny_model_dir,
        out,
        *clip_task_args(clip_task),
        "--per_device_train_batch_size",
        "2",
        recipe="configs/sft/demo_tiny.yaml",
        entry=("tests/launch_probe_sft.py",),
    )
    result = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    for rank in (0, 1):
        probe = json.loads((out / f"probe.rank{rank}.json").read_text())
        assert probe["vision_dtype"] == "torch.bfloat16", probe  # the run is really bf16
        sampled = probe["sampled_seconds"]
        assert sampled and all(0.998 < s < 1.0 for s in sampled), sampled  # the clips do what they are for
        assert probe["model_seconds"] == sampled, probe
        assert set(probe["model_dtypes"]) == {"torch.float32"}, probe
    ended_in_order(out)


# PEFT's PeftModel reads transformers' deprecated is_gradient_checkpointing property when the merge loads the adapter
# (video_grpo.plan.layers filters it the same way): a library's warning, shown here since the merge runs in-process
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_checkpointing_zero3_trains_after_an_evaluation_and_merges(tiny_model_dir, tmp_path, clip_task):
    """PEFT + ZeRO-3 + gradient checkpointing needs use_reentrant=True (TRL forces it); the evaluation before the
    second step must hand that setting back, or the backward after it runs with transformers' default. With beta
    > 0 the reference is the base with the adapter off (a KL is logged, no copy); the saved adapter holds only LoRA
    weights, and ``video_grpo.merge_lora`` folds it into the base's language model (the vision tower untouched)."""
    out = tmp_path / "run"
    cmd = launch_command(
        "cpu/zero3.yaml",
        tiny_model_dir,
        out,
        *clip_task_args(clip_task),
        *(
            "--use_peft",
            "true",
            "--lora_r",
            "8",
            "--lora_alpha",
            "16",
            "--lora_target_modules",
            "q_proj",
            "v_proj",
        ),
        *("--beta", "0.04", "--learning_rate", "1e-2"),
        *("--gradient_checkpointing", "true", "--per_device_train_batch_size", "4", "--num_generations", "2"),
        *("--max_completion_length", "16", "--eval_strategy", "steps", "--eval_steps", "1"),
        *("--per_device_eval_batch_size", "1", "--eval_grounding_samples", "2"),
        entry=("tests/launch_entry.py", "--record", str(tmp_path / "ends"), "video_grpo.grpo"),
    )
    result = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert len([e for e in history if "eval_mIoU" in e]) == 2 and history[-1]["step"] == 2, history
    assert any(
        entry.get("kl") is not None for entry in history
    )  # beta > 0: the adapter-off base is the reference
    ended_in_order(tmp_path / "ends")
    adapter = load_file(out / "adapter_model.safetensors")
    assert adapter and all("lora_" in name for name in adapter)
    merged_dir = tmp_path / "merged"
    # video_grpo.merge_lora's main, in this process (its __main__ only passes sys.argv to it): a process of its own
    # would import torch, transformers and peft again for a merge of a tiny model
    from video_grpo.merge_lora import main as merge_lora

    assert merge_lora(["--adapter_dir", str(out), "--output_dir", str(merged_dir)]) == 0
    initial, merged = load(tiny_model_dir), load(merged_dir)
    assert changed(initial, merged, "language")  # the LoRA delta is in the merged weights
    assert not changed(initial, merged, "vision")  # LoRA targeted only the language model's q/v
