"""The planner's prompt length (``video_grpo.plan.prompt_text``) against the prompts the processor really builds.

The plan's prompt sizes the compiled decoder's static cache: a real prompt longer than planned makes the decoder
reallocate it and recompile, and every prompt-length term of the memory plan short. Here each family's tiny recipe
builds its longest prompt (the recipe's data at its video budget's worst case) through the training path
(``build_dataset`` then ``encode_rows``), and the plan must hold it, with its answers, without planning more than
:data:`LOOSEST` of it. The real Qwen2.5-VL processor (../shared/reference, when present) is checked the same way,
and against the counts the planner uses for Hub models it cannot read offline."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoProcessor

from video_grpo.configs import TIMELENS_PROMPT_TEXT_TIMESTAMPS, script_args_from_yaml
from video_grpo.data.dataset import build_dataset, dataset_kwargs
from video_grpo.inputs.families import QWEN2_5_VL, detect_family
from video_grpo.inputs.processing import encode_rows
from video_grpo.plan.startup import decode_cache_tokens
from video_grpo.plan.workload import accelerate_values, recipe_values, workload_from_recipe

from .conftest import REFERENCE

QWEN_DIR = REFERENCE / "qwen2_5_vl"
HAS_QWEN = (QWEN_DIR / "tokenizer_config.json").is_file()
LOOSEST = 1.25  # planned prompt tokens / the longest real prompt, at most
TIMELENS_7B = {"frame_timestamps_in_text": True, "prompt_template": TIMELENS_PROMPT_TEXT_TIMESTAMPS}
CASES = {  # id: (recipe, tiny family or "qwen" for the real processor, fields changed)
    "qwen2_5_vl": ("configs/grpo/demo_tiny.yaml", "qwen2_5_vl", {}),
    "qwen2_5_vl-text-timestamps": ("configs/grpo/demo_tiny.yaml", "qwen2_5_vl", TIMELENS_7B),
    "qwen3_vl": ("configs/grpo/tiny_qwen3_vl.yaml", "qwen3_vl", {}),
    "qwen3_5": ("configs/grpo/tiny_qwen3_5.yaml", "qwen3_5", {}),
    "real-qwen2_5_vl": ("configs/grpo/demo_tiny.yaml", "qwen", {}),
    "real-qwen2_5_vl-text-timestamps": ("configs/grpo/demo_tiny.yaml", "qwen", TIMELENS_7B),
}


def longest_prompt(recipe: str, model: str, changes: dict) -> tuple[int, int]:
    """(tokens, visual tokens) of the longest prompt the recipe's training data builds with ``model``'s
    processor, as the trainer builds it."""
    script_args = script_args_from_yaml(recipe, **changes)
    family = detect_family(AutoConfig.from_pretrained(model)).with_text_timestamps(
        script_args.frame_timestamps_in_text
    )
    data = build_dataset(script_args.train_file, **dataset_kwargs(script_args, family))
    rows = data.__getitems__(list(range(len(data))))
    encoded = encode_rows(AutoProcessor.from_pretrained(model), rows, family)
    lengths = [len(ids) for ids in encoded["prompt_ids"]]
    longest = lengths.index(max(lengths))
    visual = int(encoded["video_grid_thw"][longest].prod()) // family.spatial_merge**2
    return lengths[longest], visual


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_plan_holds_the_longest_prompt_the_processor_builds(case, family_model):
    recipe, which, changes = CASES[case]
    if which == "qwen" and not HAS_QWEN:
        pytest.skip(f"{QWEN_DIR} absent")
    model = str(QWEN_DIR if which == "qwen" else family_model(which))
    real, real_visual = longest_prompt(recipe, model, changes)
    values = {**recipe_values(recipe), **changes, "model_name_or_path": model}
    family = detect_family(AutoConfig.from_pretrained(model))
    work = workload_from_recipe(values, family, accelerate_values(None, None, None))
    assert real_visual == work.visual_tokens, "the data should reach the budget's worst-case video"
    assert real <= work.prompt_tokens <= LOOSEST * real, (case, "real", real, "planned", work.prompt_tokens)
    assert work.decode_cache_tokens >= real + work.completion_tokens
    started = decode_cache_tokens(script_args_from_yaml(recipe, **changes), model, work.completion_tokens)
    assert started == work.decode_cache_tokens  # what a run gives its decoder is what the plan counts
    assert work.sources["text_tokens"] == f"{model}'s tokenizer and chat template"


@pytest.mark.skipif(not HAS_QWEN, reason=f"{QWEN_DIR} absent")
def test_the_counts_for_hub_models_are_qwens_tokenizer():
    """A Hub model planned offline gets fixed counts; they are what Qwen's own tokenizer and template count."""
    from video_grpo.plan.prompt_text import PROMPT_TEXT_TOKENS, TIME_TEXT_TOKENS, text_around

    model = str(QWEN_DIR)
    for family, fixed, per_pair in (
        (QWEN2_5_VL, PROMPT_TEXT_TOKENS + 2, 0),
        (QWEN2_5_VL.with_text_timestamps(), PROMPT_TEXT_TOKENS, TIME_TEXT_TOKENS + 2),
    ):
        counted, hub = (
            text_around(family, None, model),
            text_around(family, None, "Qwen/Qwen2.5-VL-7B-Instruct"),
        )
        assert (counted.fixed, counted.per_pair) == (hub.fixed, hub.per_pair) == (fixed, per_pair)
        assert hub.source == "Qwen's measured counts (no local model folder)"
        assert counted.source == f"{model}'s tokenizer and chat template"  # counted, not the constants again


def test_a_folder_without_a_tokenizer_is_planned_with_qwens_counts_and_says_so(tiny_model_dir, tmp_path):
    """A model folder with its config alone (transformers would build an empty tokenizer from it): the plan falls
    back to Qwen's counts, and its source names the folder and why."""
    import shutil

    from video_grpo.inputs.families import QWEN3_VL
    from video_grpo.plan.prompt_text import text_around

    shutil.copy(tiny_model_dir / "config.json", tmp_path / "config.json")
    alone, hub = (
        text_around(QWEN3_VL, None, str(tmp_path)),
        text_around(QWEN3_VL, None, "Qwen/Qwen3-VL-8B-Instruct"),
    )
    assert (alone.fixed, alone.per_pair) == (hub.fixed, hub.per_pair)
    assert alone.source == f"Qwen's measured counts ({tmp_path} has no tokenizer)"
    counted = text_around(QWEN3_VL, None, str(tiny_model_dir))
    assert counted.source.endswith("tokenizer and chat template") and counted.fixed != hub.fixed
