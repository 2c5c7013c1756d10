"""Every shipped recipe builds a trainer: the tiny model and the sample data swapped in, every other value kept.

A recipe that only parses can still crash after the model loads (a ``report_to`` backend that is not
installed did, for the GPU recipes); this runs the entry point's own validation and trainer construction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from video_grpo.configs import validate_recipe
from video_grpo.grpo import build_trainer, parse_args
from video_grpo.inputs.families import FAMILIES
from video_grpo.rewards.functions import render_solution, resolve_reward_funcs
from video_grpo.trainer import VideoGRPOTrainer

from .conftest import REPO, SAMPLES

RECIPES = sorted((REPO / "configs" / "grpo").glob("*.yaml"))
# What points at data or weights that only exist on a training cluster, and the device (use_cpu, as the CPU
# twins of the accelerate configs differ from theirs); everything else stays as shipped.
DATA_FIELDS = (
    "train_file",
    "eval_file",
    "video_root",
    "durations_file",
    "dataset_format",
    "frame_cache_dir",
    "sample_weight_file",
)


def recipe_family(model_name: str) -> str:
    """The family a recipe's model belongs to, from its name: the hub is out of reach here, so its config.json
    cannot be read (the entry point itself reads model_type from it)."""
    name = model_name.lower().replace("-", "_").replace(".", "_")
    return next((family for family in ("qwen3_vl", "qwen3_5") if family in name), "qwen2_5_vl")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.name)
def test_shipped_recipe_builds_a_trainer(recipe, family_model, tmp_path, caplog):
    shipped = yaml.safe_load(recipe.read_text())
    family = recipe_family(shipped["model_name_or_path"])
    tiny_model_dir = family_model(family)
    swapped = {
        **{k: v for k, v in shipped.items() if k not in DATA_FIELDS},
        "model_name_or_path": str(tiny_model_dir),
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
    }
    if shipped.get("train_sources"):  # each source's file swapped for a sample in its format; its prompt kept
        samples = [
            SAMPLES / "timelens" / "timelens2-93k_raw_annotations.jsonl",
            SAMPLES / "timelens" / "timelens-100k_samples.jsonl",
        ]
        swapped["train_sources"] = {
            name: {
                **{k: v for k, v in source.items() if k not in DATA_FIELDS},
                "train_file": str(samples[i % 2]),
                "video_root": str(SAMPLES / "videos"),
                "durations_file": None,
            }
            for i, (name, source) in enumerate(shipped["train_sources"].items())
        }
    else:
        swapped["train_file"] = str(SAMPLES / "train.jsonl")
    if shipped.get("eval_file"):
        swapped["eval_file"] = str(SAMPLES / "test.jsonl")
    if shipped.get("sample_weight_file"):  # TimeLens2's draw weights: one mean IoU per sample query
        swapped["sample_weight_file"] = str(tmp_path / "per_query.jsonl")  # written below, from the rows' ids
    path = tmp_path / recipe.name
    path.write_text(yaml.safe_dump(swapped))
    script_args, training_args, model_args = parse_args(["--config", str(path)])
    if shipped.get("sample_weight_file"):
        from video_grpo.data.dataset import build_datasets

        rows, _ = build_datasets(script_args, FAMILIES[family])
        ids = rows.with_format(None)["id"]
        Path(swapped["sample_weight_file"]).write_text(
            "".join(json.dumps({"id": i, "mean_iou": 0.5}) + "\n" for i in ids)
        )
    validate_recipe(script_args, training_args, model_args)
    trainer = build_trainer(script_args, training_args, model_args)
    assert isinstance(trainer, VideoGRPOTrainer) and trainer.family.name == family
    for key in (
        "num_generations",
        "learning_rate",
        "beta",
        "temperature",
        "max_completion_length",
        "report_to",
    ):
        if key in shipped:
            value, expected = getattr(trainer.args, key), shipped[key]
            expected = [] if expected == "none" else expected
            assert value == expected or value == [expected], (key, value, expected)
    # shared_prefix unset: on in every family (Qwen3.5's Gated DeltaNet state is forked), with no warning
    if shipped.get("shared_prefix") is None:
        assert trainer.shared_prefix and trainer.shared_prefill, recipe.name
        assert "shared_prefix is off" not in caplog.text


# Each built-in reward's score for an answer that is exactly right (its best).
BEST_SCORE = {
    "iou": 1.0,
    "iou_answer_only": 1.0,
    "iou_dist": 1.0,
    "multi_span_iou": 1.0,
    "tiou": 1.0,
    "twass": 1.0,
    "format": 1.0,
    "format_soft": 1.0,
    "length_penalty": 0.0,
    "parse_penalty": 0.0,
}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.name)
def test_shipped_rewards_give_their_best_to_the_recipes_own_answer(recipe):
    """The recipe's answer template, written from the true span, is what its prompt asks for and what SFT teaches:
    every reward the recipe names must give it its best score. (TimeLens2's untagged JSON answers once met `iou`,
    which reads only an <answer> block and gave every one of them 0.)"""
    from video_grpo.configs import GRPOScriptArguments

    defaults = GRPOScriptArguments(train_file="unused")
    shipped = yaml.safe_load(recipe.read_text())
    names = shipped.get("reward_funcs") or defaults.reward_funcs
    template = shipped.get("answer_template") or defaults.answer_template
    funcs = resolve_reward_funcs(names, shipped.get("reward_kwargs"))
    solutions = [[3.0, 7.5]] + ([[[3.0, 7.5], [12.0, 14.0]]] if "{spans}" in template else [])
    for solution in solutions:
        answer = render_solution(template, solution, "the person opens a door")
        for name, func in zip(names, funcs, strict=True):
            assert name in BEST_SCORE, f"{name}: add the reward's best score to BEST_SCORE"
            got = func(completions=[answer], solution=[solution], duration=[20.0])[0]
            assert got == pytest.approx(BEST_SCORE[name]), (recipe.name, name, answer, got)
