"""Ground-truth-guided groups (TempSamp-R1) in VideoGRPOTrainer: one guided answer per group, written from the
annotation; shaped advantages; the loss is still the GRPO loss of grpo_math; options that reuse a generation."""

from __future__ import annotations

import math

import pytest
import torch

from video_grpo.configs import ANSWER_DECIMALS
from video_grpo.data.dataset import build_dataset
from video_grpo.loss.grpo_math import grpo_loss
from video_grpo.loss.guidance import guided_completion_ids, guided_mask
from video_grpo.rewards.functions import DEFAULT_ANSWER_TEMPLATE, iou_reward

from .test_trainer import SAMPLING, make_trainer

G = 4


def scripted_iou(completions, solution, duration, **kwargs) -> list[float]:
    """Accuracy reward: the sampled answers of each group score 0.8, 0.8 and 0.79; the last answer of a group
    (the guided one) scores its real IoU with the annotation, which is 1."""
    real = iou_reward(completions=completions, solution=solution, duration=duration)
    return [real[i] if i % G == G - 1 else (0.8, 0.8, 0.79)[i % G] for i in range(len(completions))]


@pytest.fixture(scope="module")
def dataset(train_file):
    return build_dataset(train_file, sampling=SAMPLING)


def guided_trainer(tiny_model_dir, dataset, tmp_path, shaping="tempsamp", guidance=True, **overrides):
    return make_trainer(
        tiny_model_dir,
        dataset,
        tmp_path,
        reward_funcs=[scripted_iou],
        num_generations=G,
        per_device_train_batch_size=8,
        max_completion_length=8,
        trainer_kwargs={"gt_guidance": guidance, "advantage_shaping": shaping},
        **overrides,
    )


def capture_generations(trainer) -> list[tuple[list[dict], dict]]:
    seen = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        output = original(inputs)
        seen.append((inputs, output))
        return output

    trainer._generate_and_score_completions = spy
    return seen


def completion_rows(output) -> list[list[int]]:
    return [
        ids[mask.bool()].tolist()
        for ids, mask in zip(output["completion_ids"], output["completion_mask"], strict=True)
    ]


def test_guided_rows_are_the_last_of_each_group_across_ranks():
    assert guided_mask(0, 4, 8) == [False] * 4  # a group of 8 split over two ranks of 4 rows
    assert guided_mask(1, 4, 8) == [False, False, False, True]
    assert guided_mask(0, 8, 4) == [False, False, False, True] * 2


def test_one_guided_answer_per_group_written_from_the_annotation(tiny_model_dir, dataset, tmp_path):
    trainer = guided_trainer(tiny_model_dir, dataset, tmp_path)
    seen = capture_generations(trainer)
    trainer.train()
    inputs, output = seen[0]
    rows = completion_rows(output)
    tokenizer = trainer.processing_class.tokenizer
    for group in range(len(rows) // G):
        members = range(group * G, (group + 1) * G)
        written = [
            guided_completion_ids(tokenizer, inputs[i], DEFAULT_ANSWER_TEMPLATE, trainer.eos_token_ids[0])
            for i in members
        ]
        matches = [rows[i] == written[k] for k, i in enumerate(members)]
        assert matches == [False] * (G - 1) + [True], (group, matches)
    guided_text = tokenizer.decode(rows[G - 1], skip_special_tokens=True)
    start, end = inputs[G - 1]["solution"]
    assert f"<answer>{start:.{ANSWER_DECIMALS}f} to {end:.{ANSWER_DECIMALS}f}</answer>" in guided_text
    assert all(math.isfinite(float(e["loss"])) for e in trainer.state.log_history if "loss" in e)


def test_guided_answer_is_written_like_the_cold_start_target(tiny_model_dir):
    """The guided answer and the SFT target are one text: same template, same precision (ANSWER_DECIMALS, the
    cold start's 1 place), so guidance pushes the policy toward an answer it could have sampled."""
    from transformers import AutoProcessor

    from video_grpo.inputs.families import QWEN2_5_VL
    from video_grpo.sft import VideoSFTCollator

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    tokenizer = processor.tokenizer
    row = {"solution": [7.3, 10.24], "sentence": "the screen turns red"}
    assert ANSWER_DECIMALS == 1  # the cold start's precision is the default
    target = VideoSFTCollator(processor, DEFAULT_ANSWER_TEMPLATE, QWEN2_5_VL).answer(row)
    guided = guided_completion_ids(tokenizer, row, DEFAULT_ANSWER_TEMPLATE, tokenizer.eos_token_id)
    assert guided[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(guided[:-1]) == target
    assert target.endswith("<answer>7.3 to 10.2</answer>"), target
    wider = guided_completion_ids(tokenizer, row, DEFAULT_ANSWER_TEMPLATE, tokenizer.eos_token_id, decimals=2)
    assert "<answer>7.30 to 10.24</answer>" in tokenizer.decode(wider)  # the setting is what decides


def test_guiding_only_groups_that_all_miss():
    """miss_below: a group with a sampled hit is plain GRPO over its sampled answers (the guided answer leaves the
    statistics, advantage 0); a group whose sampled answers all miss keeps its guided answer."""
    from video_grpo.loss.guidance import group_advantages

    iou = torch.tensor([0.1, 0.6, 0.0, 1.0, 0.2, 0.3, 0.0, 1.0])
    rewards = torch.stack([iou, torch.ones(8)], dim=1)
    guided = torch.tensor([False, False, False, True] * 2)
    weights = torch.ones(2)
    every = group_advantages(rewards, weights, 4, guided, "tempsamp", "group")
    only = group_advantages(rewards, weights, 4, guided, "tempsamp", "group", miss_below=0.5)
    assert only[3] == 0 and every[3] > 0  # group 0 has a sampled IoU of 0.6: not guided
    unguided = group_advantages(
        rewards[:3], weights, 3, torch.zeros(3, dtype=torch.bool), "tempsamp", "group"
    )
    assert torch.allclose(only[:3], unguided)
    assert torch.allclose(only[4:], every[4:]) and only[7] > 0  # group 1 all below 0.5: guided as before
    assert torch.equal(group_advantages(rewards, weights, 4, guided, "tempsamp", "group", tau=0.8), every)


@pytest.mark.parametrize(("shaping", "all_negative"), [("none", True), ("tempsamp", False)])
def test_shaping_keeps_good_sampled_answers_positive(
    tiny_model_dir, dataset, tmp_path, shaping, all_negative
):
    """Sampled IoUs 0.8, 0.8, 0.79 against the guided answer's 1: plain group normalisation pushes all three
    below zero; TempSamp's Eq. 4 keeps the two 0.8 answers above the group mean."""
    trainer = guided_trainer(tiny_model_dir, dataset, tmp_path, shaping=shaping)
    seen = capture_generations(trainer)
    trainer.train()
    advantages = seen[0][1]["advantages"].view(-1, G)
    assert (advantages[:, -1] > 0).all()  # the guided answer wins
    assert bool((advantages[:, :-1] < 0).all()) is all_negative, advantages
    logged = [
        e["guidance/groups_all_sampled_negative"]
        for e in trainer.state.log_history
        if "guidance/groups_all_sampled_negative" in e
    ]
    assert logged == [1.0 if all_negative else 0.0]
    sampled = [
        e["guidance/sampled_accuracy_reward"]
        for e in trainer.state.log_history
        if "guidance/sampled_accuracy_reward" in e
    ]
    assert sampled == [pytest.approx((0.8 + 0.8 + 0.79) / 3)]  # the policy's own answers only


def test_guided_batch_loss_equals_grpo_math(tiny_model_dir, dataset, tmp_path):
    trainer = guided_trainer(tiny_model_dir, dataset, tmp_path, beta=0.04)
    seen = capture_generations(trainer)
    trainer.train()
    _, output = seen[0]
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    trainer._video_rows = {k: output[k] for k in ("video_pixels", "video_grid_thw", "second_per_grid_ts")}
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, output["completion_ids"].size(1)
        )
    trainer._video_rows = None
    old = output["old_per_token_logps"] if output.get("old_per_token_logps") is not None else logps
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (
        logps,
        torch.zeros_like(logps),
        None,
    )
    trainer_loss = trainer._compute_loss(trainer.model, output)
    module_loss = grpo_loss(
        logps,
        old,
        output["advantages"],
        output["completion_mask"].float(),
        epsilon_low=0.2,
        beta=0.04,
        ref_per_token_logps=output["ref_per_token_logps"],
    )
    assert trainer_loss.item() == pytest.approx(module_loss.item(), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    "options",
    [{"num_iterations": 2, "max_steps": 2}, {"steps_per_generation": 2, "max_steps": 2}],
    ids=["num_iterations", "steps_per_generation"],
)
def test_guidance_with_reused_generations(tiny_model_dir, dataset, tmp_path, options):
    trainer = guided_trainer(tiny_model_dir, dataset, tmp_path, **options)
    seen = capture_generations(trainer)
    trainer.train()
    assert seen and all(
        sum(
            r
            == guided_completion_ids(
                trainer.processing_class.tokenizer,
                inputs[i],
                DEFAULT_ANSWER_TEMPLATE,
                trainer.eos_token_ids[0],
            )
            for i, r in enumerate(completion_rows(output))
        )
        == len(inputs) // G
        for inputs, output in seen
    )
    losses = [float(e["loss"]) for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def test_a_one_span_guided_answer_over_multi_span_data_fails_before_the_model_loads(
    tiny_model_dir, tmp_path, monkeypatch
):
    """gt_guidance writes each group's guided answer from the annotation: a {start}/{end} template over a file with
    multi-span queries used to raise inside the first generation (answers.render_solution); now build_trainer
    refuses it once the data is read, before the trainer loads the model, naming the file, the first such query and
    the fix. A {spans} template passes."""
    import yaml

    from video_grpo import grpo
    from video_grpo.loss.guidance import check_guided_template
    from video_grpo.rewards.answers import JSON_ANSWER_TEMPLATE

    from .conftest import SAMPLES

    def no_model(*args, **kwargs):
        raise AssertionError("the trainer (and the model) should not have been built")

    monkeypatch.setattr(grpo, "VideoGRPOTrainer", no_model)
    multi_span = SAMPLES / "timelens" / "timelens2-93k_raw_annotations.jsonl"
    recipe = yaml.safe_load((SAMPLES.parent / "configs" / "grpo" / "demo_tiny.yaml").read_text())
    recipe.update(
        model_name_or_path=str(tiny_model_dir),
        train_file=str(multi_span),
        video_root=str(SAMPLES / "videos"),
        output_dir=str(tmp_path / "out"),
        gt_guidance=True,
        advantage_shaping="tempsamp",
    )
    del recipe["eval_file"]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ValueError) as caught:
        grpo.build_trainer(*grpo.parse_args(["--config", str(path)]))
    message = str(caught.value)
    assert message.startswith("gt_guidance: answer_template") and "writes one span ({start}/{end})" in message
    assert f"train_file {multi_span}" in message and "the first: train_000_1, 2 spans" in message
    assert "{spans}" in message and "video_grpo.rewards.answers.JSON_ANSWER_TEMPLATE" in message
    dataset = build_dataset(multi_span, video_root=SAMPLES / "videos", sampling=SAMPLING)
    check_guided_template(JSON_ANSWER_TEMPLATE, dataset, {None: "unused"})  # every span written: no error
    one_span = build_dataset(SAMPLES / "train.jsonl", sampling=SAMPLING)
    check_guided_template(DEFAULT_ANSWER_TEMPLATE, one_span, {None: "unused"})  # [s, e] rows: no error
