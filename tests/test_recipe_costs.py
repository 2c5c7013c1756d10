"""The TimeLens cost table (video_grpo.bench.recipe_costs, docs/planning.md): the variants plan what they say."""

from __future__ import annotations

from video_grpo.bench.recipe_costs import PRESETS, VARIANTS, variant_plan


def test_variants_of_the_7b_preset():
    name, recipe, model_config = PRESETS[0]
    plans = {label: variant_plan(recipe, model_config, "h200-141gb", o, w) for label, o, w in VARIANTS[:3]}
    shipped, off, think = plans.values()
    assert (
        shipped.work.zero_stage == 1 and shipped.work.visual_tokens == 14336 and shipped.work.group_size == 8
    )
    assert shipped.work.shared_prefix and shipped.work.encode_once
    assert not off.work.shared_prefix and not off.work.encode_once
    assert think.work.completion_tokens == 1024 and think.work.text_tokens > shipped.work.text_tokens
    assert off.memory.peak > 2 * shipped.memory.peak and off.seconds["loss"] > 3 * shipped.seconds["loss"]
    assert think.seconds["generation"] > 2 * shipped.seconds["generation"]
