"""The TimeLens2 presets carry TimeLens2's published values (MCG-NJU/TimeLens2 at a5ce450: grpo/scripts/train.sh
and train_grpo_{4b,8b}.sh, grpo/timelens/config.py, grpo/configs/data/timelens2.json, sft/configs/_base.py,
evaluation's TimeLens_Charades_4fps), the SFT presets parse as `video_grpo.sft` reads them, and
the evaluate preset samples as that evaluation does. Building a trainer and planning are checked for every GRPO
preset in test_recipes.py and test_plan.py."""

from __future__ import annotations

import re

import pytest
import yaml

from video_grpo.configs import check_video_budget, script_args_from_yaml
from video_grpo.data.video import SamplingConfig
from video_grpo.inputs.families import FAMILIES

from .conftest import REPO, SAMPLES

SIZES = ("4b", "8b")
# train_grpo_{4b,8b}.sh: the same values for both sizes
GRPO = {
    "num_generations": 8,  # NUM_GENERATIONS
    "video_max_tokens": 16384,  # TOTAL_TOKENS
    "video_min_pixels": 32 * 32,  # MIN_TOKENS=1
    "video_fps": 2.0,  # FPS
    "video_max_frames": 512,  # FPS_MAX_FRAMES
    "learning_rate": 1e-6,  # LEARNING_RATE
    "beta": 0.04,  # BETA
    "max_completion_length": 512,  # MAX_COMPLETION_LENGTH
    "temperature": 1.0,  # TEMPERATURE
    "top_p": 1.0,  # TOP_P
    "scale_rewards": "none",  # --scale_rewards False
    # config.py's bnpo on BATCH_PER_DEVICE=1 answer x accumulation 8 (GLOBAL_BATCH_SIZE 64 on 8 GPUs) is grpo on one
    # prompt's 8 answers per GPU, exactly (tests/test_auto_fit_math.py): the same 64 answers a step
    "loss_type": "grpo",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 1,
    "lr_scheduler_type": "constant",  # --lr_scheduler_type constant
    "freeze_vision_tower": True,  # --freeze_vision_tower True
    "train_vision_merger": True,  # --freeze_merger False
    "max_grad_norm": 1.0,
    "save_steps": 50,  # SAVE_STEPS
    "seed": 42,  # SEED
    "reward_funcs": ["twass", "tiou", "parse_penalty"],  # REWARD_FUNCS=twass1,tiou,parse_penalty
    "reward_kwargs": {"twass": {"beta": 1.0}},  # twass1
    "sample_weight_mean_power": 2,  # SAMPLE_WEIGHT_MEAN_POWER
    "sample_weight_field": "mean_iou",  # SAMPLE_WEIGHT_MEAN_SPEC=tiou: curate's mean tIoU
}
PROCESSES = re.compile(r"^num_processes: (\d+)", re.M)


def preset(kind: str, size: str) -> dict:
    return yaml.safe_load((REPO / "configs" / kind / f"timelens2_qwen3_vl_{size}.yaml").read_text())


@pytest.mark.parametrize("size", SIZES)
def test_grpo_presets_carry_the_published_values(size):
    recipe = preset("grpo", size)
    assert recipe["model_name_or_path"] == f"Qwen/Qwen3-VL-{size.upper()}-Instruct"
    assert {key: recipe[key] for key in GRPO} == GRPO
    assert recipe["max_steps"] == {"4b": 200, "8b": 300}[size]  # MAX_STEPS
    # GLOBAL_BATCH_SIZE=64 answers per optimizer step, on the launch the header names
    launch = re.search(
        r"^# Plan: fits .* with (configs/accelerate/\S+\.yaml)", yaml_text("grpo", size), re.M
    )[1]
    processes = int(PROCESSES.search((REPO / launch).read_text())[1])
    assert processes * recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"] == 64
    # their two sources, each with its prompt (their '{query}' is our '{sentence}'), the query normalised as theirs
    sources = recipe["train_sources"]
    assert list(sources) == ["timelens2-93k", "timelens-100k"]
    assert sources["timelens2-93k"]["prompt_template"].startswith(
        'You are given a video.\nTask: temporal retrieval.\nGiven the query: "{sentence}"'
    )
    assert sources["timelens-100k"]["prompt_template"].endswith(
        "Return the result strictly as [[start, end]]] (in seconds)."
    )
    assert all(source["normalize_query"] for source in sources.values())
    assert sources["timelens2-93k"]["train_file"].endswith("TimeLens2-93K_raw_annotations.jsonl")
    assert recipe["answer_template"] == "{spans}"
    # every query of both sources trains, drawn by the weights stage 2 (curate) measured
    assert recipe["sample_weight_file"] == f"outputs/curate/timelens2_{size}/per_query.jsonl"
    args = script_args_from_yaml(str(REPO / "configs" / "grpo" / f"timelens2_qwen3_vl_{size}.yaml"))
    check_video_budget(args, FAMILIES["qwen3_vl"])


def yaml_text(kind: str, size: str) -> str:
    return (REPO / "configs" / kind / f"timelens2_qwen3_vl_{size}.yaml").read_text()


@pytest.mark.parametrize("size", SIZES)
def test_sft_presets_parse_with_the_published_values(size, tmp_path):
    from video_grpo.sft import parse_args

    script_args, training_args, model_args = parse_args(
        ["--config", str(REPO / "configs" / "sft" / f"timelens2_qwen3_vl_{size}.yaml")]
        + ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false"]
    )
    assert model_args.model_name_or_path == f"Qwen/Qwen3-VL-{size.upper()}-Instruct"
    assert training_args.learning_rate == 5e-6 and training_args.lr_scheduler_kwargs == {"min_lr": 5e-7}
    assert training_args.num_train_epochs == 1 and training_args.weight_decay == 0.0
    assert 8 * training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps == 256
    assert script_args.freeze_vision_tower and script_args.answer_template == "{spans}"
    assert (script_args.video_fps, script_args.video_max_frames) == (2.0, 2048)
    assert (script_args.video_min_pixels, script_args.video_max_pixels) == (4 * 32 * 32, 480 * 480)
    assert script_args.video_max_tokens == int(102400 * 0.8)
    check_video_budget(script_args, FAMILIES["qwen3_vl"])
    # the stage-3 TimeLens2-93K prompt, so that GRPO starts from the answer form SFT taught
    assert (
        script_args.prompt_template
        == preset("grpo", size)["train_sources"]["timelens2-93k"]["prompt_template"]
    )
    assert script_args.normalize_query


def test_the_evaluate_preset_samples_as_timelens_charades_4fps():
    path = REPO / "configs" / "evaluate" / "timelens2_charades_4fps.yaml"
    args = script_args_from_yaml(str(path))
    sampling = SamplingConfig.from_args(args, FAMILIES["qwen3_vl"])
    # fps=4.0, frames_limit=2048, min_pixels=32*32, max_pixels=640*640, total_pixels=128000*32*32
    assert (sampling.fps, sampling.max_frames) == (4.0, 2048)
    assert (sampling.min_pixels, sampling.max_pixels, sampling.max_tokens) == (32 * 32, 640 * 640, 128000)
    check_video_budget(args, FAMILIES["qwen3_vl"])
    assert args.eval_file.endswith("charades-timelens.json")
    # its data reads as TimeLens-Bench (the fixture stands in for the published file)
    from video_grpo.data.annotations import detect_format

    assert detect_format(SAMPLES / "timelens" / "charades-timelens.json") == "timelens_bench"
