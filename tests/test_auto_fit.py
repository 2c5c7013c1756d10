"""``auto_fit: true``: the cheapest changes that keep the mathematics, chosen with the planner's ranking, applied
before the model loads (``video_grpo.plan.autofit``, ``video_grpo.grpo.apply_auto_fit``). That those changes keep
the mathematics is tests/test_auto_fit_math.py's."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from video_grpo.plan import plan_recipe
from video_grpo.plan.autofit import auto_fit
from video_grpo.plan.recipe import GB

RECIPE = "configs/grpo/demo_tiny.yaml"  # planned at 0.172 GB on one CPU process (0.151 GB with checkpointing)


def tiny_plan(model_dir, memory_gb: float, **overrides):
    return plan_recipe(
        RECIPE,
        gpu="cpu",
        gpu_memory_gb=memory_gb,
        model_config=str(model_dir / "config.json"),
        overrides={"model_name_or_path": str(model_dir), **overrides},
    )


def arguments(model_dir, tmp_path, *flags: str):
    from video_grpo.grpo import parse_args

    return parse_args(
        ["--config", RECIPE, "--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path), *flags]
    )


def test_the_cheapest_change_that_fits_is_chosen_in_the_planners_order(tiny_model_dir):
    """Checkpointing ranks first, then the micro-batch (each halving one change); the micro-batch keeps the
    generation batch: its change doubles steps_per_generation and leaves the generation phase's plan as it was."""
    plan = tiny_plan(tiny_model_dir, 0.16)
    assert plan.fits is False
    fitted = auto_fit(plan, "grpo")
    assert fitted.changes == ["activation_checkpointing: true"] and fitted.after.fits
    assert fitted.summary().startswith(
        "auto_fit: activation_checkpointing: true. Planned peak 0.17 GB -> 0.15 GB"
    )
    assert fitted.fields == {"gradient_checkpointing": True}

    fitted = auto_fit(tiny_plan(tiny_model_dir, 0.14), "grpo")  # checkpointing alone is 0.151 GB
    assert fitted.fields == {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 2,
    }
    before, after = fitted.before, fitted.after
    assert after.work.generation_rows == before.work.generation_rows == 8
    assert after.memory.phases["generation"].peak == before.memory.phases["generation"].peak
    assert after.memory.peak < 0.14 * GB < before.memory.peak

    fitted = auto_fit(tiny_plan(tiny_model_dir, 0.10), "dapo")  # one change is not enough
    assert (
        fitted.fields["gradient_checkpointing"] is True and fitted.fields["per_device_train_batch_size"] == 2
    )
    assert (
        fitted.fields["steps_per_generation"] == 4 and len(fitted.changes) == 2
    )  # the halvings are one change


def test_auto_fit_applies_in_process_and_keeps_the_generation_batch(tiny_model_dir, tmp_path, caplog):
    from video_grpo.grpo import apply_auto_fit

    script_args, training_args, model_args = arguments(
        tiny_model_dir, tmp_path, "--auto_fit", "true", "--auto_fit_memory_gb", "0.14"
    )
    assert (training_args.generation_batch_size, training_args.steps_per_generation) == (8, 1)
    with caplog.at_level(logging.WARNING):
        apply_auto_fit(script_args, training_args, model_args)
    assert training_args.per_device_train_batch_size == 4 and training_args.gradient_accumulation_steps == 2
    assert training_args.steps_per_generation == 2 and training_args.generation_batch_size == 8
    record = json.loads((tmp_path / "auto_fit.json").read_text())
    assert record["before"] == {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 1,
    }
    assert record["after"]["per_device_train_batch_size"] == 4 and record["usable_gb"] == 0.14
    assert record["planned_peak_gb_before"] > 0.14 >= record["planned_peak_gb_after"]
    assert record["generation_rows_per_process"] == record["rows_per_optimizer_step_per_process"] == 8
    assert record["ranks"]["processes"] == 1 and record["ranks"]["fitted_for_rank"] == 0  # its own device
    assert "auto_fit: per_device_train_batch_size: 4" in caplog.text and "auto_fit.json: {" in caplog.text


def test_when_nothing_that_keeps_the_math_fits_the_run_stops_before_the_model_loads(
    tiny_model_dir, tmp_path, monkeypatch
):
    import video_grpo.grpo as entry

    def no_model_loading(*args, **kwargs):
        raise AssertionError("a model or processor was loaded before auto_fit stopped the run")

    monkeypatch.setattr(entry.AutoProcessor, "from_pretrained", no_model_loading)
    monkeypatch.setattr(entry, "VideoGRPOTrainer", no_model_loading)
    args = arguments(
        tiny_model_dir, tmp_path, "--auto_fit", "true", "--auto_fit_memory_gb", "0.14", "--loss_type", "bnpo"
    )
    with pytest.raises(ValueError, match="auto_fit: no change that keeps the mathematics fits") as stopped:
        entry.main(*args)
    message = str(stopped.value)
    # bnpo's micro-batch would change the step: it is listed, with its planned peak, among the changes that do
    assert "not tried: a smaller micro-batch: loss_type 'bnpo'" in message
    assert "change the mathematics of a step" in message
    assert (
        "per_device_train_batch_size: 4, gradient_accumulation_steps: 2, steps_per_generation: 2: peak 0.13 GB"
        in message
    )
    assert not (tmp_path / "auto_fit.json").exists()


def test_a_cpu_run_needs_the_memory_to_fit(tiny_model_dir, tmp_path):
    from video_grpo.grpo import apply_auto_fit

    with pytest.raises(ValueError, match="auto_fit_memory_gb: not set"):
        apply_auto_fit(*arguments(tiny_model_dir, tmp_path, "--auto_fit", "true"))


def test_the_planner_previews_auto_fit(tiny_model_dir, capsys, tmp_path):
    import yaml

    from video_grpo.plan import main

    # the recipe's model is the tiny folder, whose tokenizer counts the prompt (outputs/ may not exist: a fresh
    # clone before make tiny, where the planner would count with Qwen's tokenizer's numbers instead)
    recipe = tmp_path / "recipe.yaml"
    values = yaml.safe_load(Path(RECIPE).read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**values, "model_name_or_path": str(tiny_model_dir)}))
    config = str(tiny_model_dir / "config.json")
    flags = ["--config", str(recipe), "--model_config", config, "--gpu", "cpu", "--gpu_memory_gb", "0.16"]
    assert main([*flags, "--auto_fit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["after"] == {"gradient_checkpointing": True}


@pytest.mark.usefixtures("our_warnings_raise_but_trls_checkpointing")  # demo_tiny: no warning of ours
def test_a_cpu_run_fits_itself_and_checks_its_plan(tiny_model_dir, tmp_path, caplog, checkpointed_calls):
    """The issue's command, in-process: demo_tiny with a budget just under its plan (0.16 of 0.172 GB) trains its
    steps with checkpointing on (counted: the loss forwards ran checkpointed segments; tests/test_plan_check.py's
    runs, without checkpointing, ran none), and its plan check (the second step, live tensor bytes) is within 15% at
    the peak."""
    import video_grpo.grpo as entry

    flags = ("--auto_fit", "true", "--auto_fit_memory_gb", "0.16", "--plan_check", "true", "--max_steps", "2")
    with caplog.at_level(logging.WARNING):
        entry.main(*arguments(tiny_model_dir, tmp_path, *flags))
    fitted = json.loads((tmp_path / "auto_fit.json").read_text())
    assert fitted["changes"] == ["activation_checkpointing: true"] and fitted["fits_after"]
    saved = torch.load(tmp_path / "training_args.bin", weights_only=False)
    assert saved.gradient_checkpointing and saved.per_device_train_batch_size == 8
    assert saved.generation_batch_size == 8
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1, 2]
    assert len(checkpointed_calls) > 0, (
        "gradient_checkpointing was saved as on, but no segment ran checkpointed"
    )
    check = json.loads((tmp_path / "plan_check.json").read_text())
    assert check["step"] == 2 and set(check["phases"]) == {
        "generation",
        "old_and_reference",
        "loss",
        "optimizer",
    }
    assert abs(check["peak"]["ratio"] - 1) <= 0.15, check["peak"]
    assert check["plan"]["workload"]["gradient_checkpointing"] is True  # the fitted run's plan
    assert "plan check: peak planned" in caplog.text


def test_layer_by_layer_gathering_says_it_turns_compiled_decoding_off_and_is_never_applied_under_true():
    """The 7B recipe on a 40 GB card, ZeRO-3 (docs/planning.md's worked example): under decode_compile auto the
    fit is ds3_gather_for_generation: false, whose text and auto_fit.json say that decoding is then eager; under
    true that change is excluded (the trainer would refuse the pair after loading), with the reason."""
    flags = {
        "accelerate_config": "configs/accelerate/zero3.yaml",
        "gpu": "a100-40gb",
        "model_config": "configs/models/qwen2_5_vl_7b_instruct.json",
    }
    fitted = auto_fit(plan_recipe("configs/grpo/qwen2_5_vl_7b_charades.yaml", **flags), "grpo")
    assert fitted.fields == {"ds3_gather_for_generation": False}
    assert "decode_compile auto turns compiled decoding off" in fitted.summary()
    assert fitted.as_json()["decode_path"] == {"before": "compiled", "after": "eager"}
    strict = plan_recipe(
        "configs/grpo/qwen2_5_vl_7b_charades.yaml", **flags, overrides={"decode_compile": "true"}
    )
    fitted = auto_fit(strict, "grpo")
    assert "ds3_gather_for_generation" not in fitted.fields
    assert any("decode_compile is true" in reason for reason in fitted.excluded), fitted.excluded


def test_each_loss_is_offered_a_smaller_micro_batch_where_trls_step_does_not_depend_on_the_split():
    """The rule, per loss_type and entropy setting (tests/test_auto_fit_math.py measures it against TRL's loss):
    the reason names what depends on the split, not a blanket one."""
    from video_grpo.plan.loss_split import TRL_LOSSES, LossSettings, micro_batch_refusal

    offered = [loss for loss in TRL_LOSSES if micro_batch_refusal(loss) is None]
    assert offered == ["grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
    assert "by that micro-batch's own token count" in micro_batch_refusal("bnpo")
    assert "none of TRL 1.16's losses" in micro_batch_refusal("reinforce")
    adaptive = micro_batch_refusal(
        LossSettings("dapo", use_adaptive_entropy=True)
    )  # entropy_coef 0: still on
    assert adaptive.startswith(
        "the entropy bonus (use_adaptive_entropy: true) is TRL's mean entropy over each"
    )
    quantile = micro_batch_refusal(LossSettings("grpo", top_entropy_quantile=0.2))
    assert quantile.startswith("top_entropy_quantile 0.2 keeps a quantile of each micro-batch's tokens")
    # from a recipe's values (a mapping) or a GRPOConfig (attributes), TRL's defaults for what is not given
    assert LossSettings.of({"loss_type": "sapo", "entropy_coef": 0.01}) == LossSettings(
        "sapo", 1.0, 0.01, False
    )


def budget_at(model_dir, fraction: float, **overrides) -> str:
    """``fraction`` of demo_tiny's planned peak (with ``overrides``), in GB, as --auto_fit_memory_gb takes it."""
    plan = tiny_plan(model_dir, 1.0, **overrides)
    return f"{fraction * plan.memory.peak / GB:.4f}"


@pytest.mark.parametrize("loss_type", ["dr_grpo", "sapo"])
def test_at_094_of_its_plan_dr_grpo_and_sapo_fit_by_a_smaller_micro_batch(
    tiny_model_dir, tmp_path, loss_type
):
    """demo_tiny with checkpointing already on (so the cheaper change is spent): at 0.94 of its plan the fit halves
    the micro-batch and doubles the accumulation, the optimizer batch (8 rows) and the generation batch kept."""
    from video_grpo.grpo import apply_auto_fit

    budget = budget_at(tiny_model_dir, 0.94, gradient_checkpointing=True, loss_type=loss_type)
    flags = ("--gradient_checkpointing", "true", "--loss_type", loss_type)
    script_args, training_args, model_args = arguments(
        tiny_model_dir, tmp_path, *flags, "--auto_fit", "true", "--auto_fit_memory_gb", budget
    )
    apply_auto_fit(script_args, training_args, model_args)
    assert (training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps) == (4, 2)
    assert (training_args.steps_per_generation, training_args.generation_batch_size) == (2, 8)
    record = json.loads((tmp_path / "auto_fit.json").read_text())
    assert record["rows_per_optimizer_step_per_process"] == record["generation_rows_per_process"] == 8
    assert record["fits_after"] and not record["excluded"]


def test_with_the_entropy_bonus_no_smaller_micro_batch_is_applied(tiny_model_dir, tmp_path):
    """entropy_coef 0.01 at the same 0.94: the micro-batch would fit but change the step, so the run stops before
    the model loads, giving the bonus as the reason and the micro-batch among the changes that do not keep it."""
    from video_grpo.grpo import apply_auto_fit

    budget = budget_at(tiny_model_dir, 0.94, gradient_checkpointing=True)
    flags = ("--gradient_checkpointing", "true", "--entropy_coef", "0.01")
    script_args, training_args, model_args = arguments(
        tiny_model_dir, tmp_path, *flags, "--auto_fit", "true", "--auto_fit_memory_gb", budget
    )
    with pytest.raises(ValueError, match="auto_fit: no change that keeps the mathematics fits") as stopped:
        apply_auto_fit(script_args, training_args, model_args)
    message = str(stopped.value)
    assert (
        "not tried: a smaller micro-batch: the entropy bonus (entropy_coef 0.01) is TRL's mean entropy"
        in message
    )
    assert "per_device_train_batch_size: 4" in message.split("change the mathematics of a step")[1]
    assert training_args.per_device_train_batch_size == 8 and not (tmp_path / "auto_fit.json").exists()


@pytest.mark.parametrize("loss_type", ["dr_grpo", "sapo"])
def test_dr_grpo_and_sapo_train_on_the_smaller_micro_batch_they_were_fitted_to(
    tiny_model_dir, tmp_path, loss_type
):
    """The issue's runs, in-process: dr_grpo, and sapo, at 0.94 of the plan train a step with micro-batch 4 x
    accumulation 2."""
    import video_grpo.grpo as entry

    budget = budget_at(tiny_model_dir, 0.94, gradient_checkpointing=True, loss_type=loss_type)
    flags = ("--gradient_checkpointing", "true", "--loss_type", loss_type, "--max_steps", "1")
    entry.main(
        *arguments(tiny_model_dir, tmp_path, *flags, "--auto_fit", "true", "--auto_fit_memory_gb", budget)
    )
    saved = torch.load(tmp_path / "training_args.bin", weights_only=False)
    assert (saved.per_device_train_batch_size, saved.gradient_accumulation_steps) == (4, 2)
    assert saved.generation_batch_size == 8 and saved.loss_type == loss_type
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1]
