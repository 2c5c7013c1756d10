import pytest
import yaml
from trl import GRPOConfig, ModelConfig, TrlParser

from video_grpo.configs import GRPOScriptArguments
from video_grpo.grpo import parse_args

from .conftest import REPO


def test_yaml_and_cli_round_trip(tmp_path):
    recipe = {
        "model_name_or_path": "some/model",
        "train_file": "a.jsonl",
        "video_fps": 1.5,
        "video_max_tokens": 900,
        "reward_funcs": ["iou", "format_soft"],
        "learning_rate": 3.0e-6,
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "output_dir": str(tmp_path / "out"),
        "bf16": False,
        "use_cpu": True,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    script, training, model = parse_args(
        ["--config", str(path), "--video_fps", "3", "--learning_rate", "1e-5"]
    )
    assert (
        isinstance(script, GRPOScriptArguments)
        and isinstance(training, GRPOConfig)
        and isinstance(model, ModelConfig)
    )
    assert script.video_fps == 3.0  # CLI beats YAML
    assert training.learning_rate == 1e-5
    assert script.video_max_tokens == 900  # YAML beats default
    assert script.reward_funcs == ["iou", "format_soft"]
    assert training.num_generations == 4 and model.model_name_or_path == "some/model"


@pytest.mark.parametrize("recipe", sorted((REPO / "configs" / "grpo").glob("*.yaml")), ids=lambda p: p.name)
@pytest.mark.usefixtures("our_warnings_raise")  # no deprecated field name in a shipped recipe
def test_shipped_recipes_parse(recipe):
    script, training, model = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(recipe), "--output_dir", "/tmp/unused", "--bf16", "false", "--use_cpu", "true"]
    )
    assert (script.train_file or script.train_sources) and model.model_name_or_path


@pytest.mark.usefixtures("our_warnings_raise")
def test_the_demos_trl_configs_take_no_deprecated_argument(tmp_path):
    """`make demo`'s cold start (scripts/demo_flash.py prepare) and the learning benchmark's runs build TRL's
    configs from these settings (video_grpo.bench.learning_runs); the demo's GRPO run is demo_flash.yaml, above."""
    from trl import SFTConfig

    from video_grpo.bench import learning_runs as runs

    SFTConfig(output_dir=str(tmp_path), max_steps=1, **runs.SFT_SETTINGS)
    GRPOConfig(output_dir=str(tmp_path), max_steps=1, **runs.GRPO_SETTINGS)


@pytest.mark.parametrize("flag", ["--gradient_checkpointing", "--activation_checkpointing"])
def test_a_checkpointing_flag_beats_the_recipe_in_either_name(flag):
    """The recipes set ``activation_checkpointing``; transformers would drop the deprecated alias given as a flag
    in favour of the recipe's current name, so the entry points rename the flag."""
    recipe = str(REPO / "configs/grpo/demo_tiny.yaml")  # activation_checkpointing: false
    _, training, _ = parse_args(["--config", recipe, "--output_dir", "/tmp/unused", flag, "true"])
    assert training.activation_checkpointing is True and training.gradient_checkpointing is True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"video_min_pixels": 200000, "video_max_pixels": 100000},
            "video_min_pixels.*above video_max_pixels",
        ),
        ({"reward_funcs": ["iou", "iuo"]}, r"unknown reward 'iuo'.*Known rewards: format, format_soft, iou"),
        ({"reward_funcs": ["nope.module:f"]}, "cannot load reward plug-in"),
        ({"video_min_frames": 10, "video_max_frames": 4}, "video_min_frames.*above video_max_frames"),
        ({"prompt_template": "no placeholder"}, "prompt_template"),
        ({"video_fps": 0}, "video_fps"),
        (
            {"reward_funcs": ["length_penalty"], "reward_kwargs": {"length_penalty": {"max_words": 3}}},
            "has no parameter 'max_words'",
        ),
        ({"reward_kwargs": "{not json"}, "reward_kwargs: is not valid JSON"),
    ],
)
def test_bad_config_fails_at_parse_time(tmp_path, overrides, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"train_file": "a.jsonl", "output_dir": str(tmp_path), **overrides}))
    with pytest.raises(ValueError, match=message):
        parse_args(["--config", str(path)])


def test_reward_kwargs_from_yaml_and_cli(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "train_file": "a.jsonl",
                "output_dir": str(tmp_path),
                "use_cpu": True,
                "bf16": False,
                "reward_funcs": ["iou", "length_penalty"],
                "reward_kwargs": {"length_penalty": {"max_think_words": 64}},
            }
        )
    )
    script, _, _ = parse_args(["--config", str(path)])
    assert script.reward_kwargs == {"length_penalty": {"max_think_words": 64}}
    script, _, _ = parse_args(
        ["--config", str(path), "--reward_kwargs", '{"length_penalty": {"max_think_words": 8}}']
    )
    assert script.reward_kwargs == {"length_penalty": {"max_think_words": 8}}


@pytest.mark.parametrize(
    ("family", "overrides", "message"),
    [
        (
            "qwen2_5_vl",
            {"video_max_tokens": 10, "video_min_frames": 8, "video_min_pixels": 784 * 16},
            "video_max_tokens.*at least 64",
        ),
        (
            "qwen3_vl",
            {"video_max_tokens": 10, "video_min_frames": 8, "video_min_pixels": 784 * 16},
            "video_max_tokens.*at least 48",
        ),  # 12544 px is 12 tokens of 32x32, not 16 of 28x28
        ("qwen2_5_vl", {"video_min_pixels": 700}, r"video_min_pixels: must be >= 784 \(one 28x28 token"),
        ("qwen3_vl", {"video_min_pixels": 1000}, r"video_min_pixels: must be >= 1024 \(one 32x32 token"),
    ],
)
def test_video_budget_uses_the_family_token_size(tmp_path, family, overrides, message):
    from video_grpo.configs import check_video_budget
    from video_grpo.inputs.families import FAMILIES

    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "train_file": "a.jsonl",
                "output_dir": str(tmp_path),
                "use_cpu": True,
                "bf16": False,
                **overrides,
            }
        )
    )
    script_args, _, _ = parse_args(["--config", str(path)])
    with pytest.raises(ValueError, match=message):
        check_video_budget(script_args, FAMILIES[family])
