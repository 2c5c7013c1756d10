"""Encoding each video once: same log-probs and gradients as the plain path, and G times fewer encoder rows."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from video_grpo.data.dataset import build_dataset
from video_grpo.inputs.encoder import install
from video_grpo.inputs.families import QWEN2_5_VL
from video_grpo.inputs.processing import encode_rows, generation_inputs

from .test_trainer import SAMPLING, make_trainer

G = 4


@pytest.fixture(scope="module")
def batch(tiny_model_dir, train_file):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    dataset = build_dataset(train_file, sampling=SAMPLING)
    rows = dataset.__getitems__([0] * G + [5] * G)  # two videos of different lengths, G rows each
    encoded = encode_rows(processor, rows, QWEN2_5_VL)
    inputs = generation_inputs(encoded, processor.tokenizer.pad_token_id, 0)
    # append a random "completion" so the loss covers generated tokens too
    completion = torch.randint(20, 200, (len(rows), 6), generator=torch.Generator().manual_seed(0))
    config = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).config
    input_ids = torch.cat([inputs["input_ids"], completion], dim=1)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.cat([inputs["attention_mask"], torch.ones_like(completion)], dim=1),
        "pixel_values_videos": inputs["pixel_values_videos"],
        "video_grid_thw": inputs["video_grid_thw"],
        "second_per_grid_ts": inputs["second_per_grid_ts"],
        "mm_token_type_ids": (input_ids == config.video_token_id).long() * 2,
    }


def logps_and_grads(model, batch):
    model.zero_grad()
    logits = model(**batch).logits[:, :-1].float()
    logps = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    (logps[:, -6:] * torch.linspace(-1, 1, logps.shape[0])[:, None]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.model.visual.named_parameters() if p.grad is not None}
    return logps.detach(), grads


def test_same_logprobs_and_gradients_as_plain_path(tiny_model_dir, batch):
    plain = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    once = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    hook = install(once)
    logps_plain, grads_plain = logps_and_grads(plain, batch)
    logps_once, grads_once = logps_and_grads(once, batch)
    torch.testing.assert_close(logps_once, logps_plain, rtol=1e-5, atol=1e-5)
    assert grads_plain and grads_plain.keys() == grads_once.keys()
    for name in grads_plain:
        torch.testing.assert_close(grads_once[name], grads_plain[name], rtol=1e-4, atol=1e-6)
    assert hook.stats.rows_encoded * G == hook.stats.rows_requested  # each video encoded once, not G times


def test_frozen_tower_reuses_features_until_reset(tiny_model_dir, batch):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    model.model.visual.requires_grad_(False)
    hook = install(model, reuse_across_calls=True)
    with torch.no_grad():
        first = model(**batch).logits
        encoded_after_first = hook.stats.rows_encoded
        second = model(**batch).logits
    assert hook.stats.rows_encoded == encoded_after_first  # second forward: no encoder work
    torch.testing.assert_close(first, second)
    hook.reset()
    with torch.no_grad():
        model(**batch)
    assert hook.stats.rows_encoded == 2 * encoded_after_first


def count_encoder_rows(trainer) -> list[int]:
    rows = []
    trainer.model.model.visual.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    return rows


@pytest.mark.parametrize("frozen", [False, True], ids=["trainable", "frozen"])
def test_training_step_encodes_each_video_once(tiny_model_dir, train_file, tmp_path, frozen):
    dataset = build_dataset(train_file, sampling=SAMPLING)
    counts = {}
    for once in (True, False):
        trainer = make_trainer(
            tiny_model_dir,
            dataset,
            tmp_path / str(once),
            num_generations=8,
            per_device_train_batch_size=8,
            beta=0.04,
            steps_per_generation=2,
            gradient_accumulation_steps=2,
            max_steps=1,
            # shared_prefix off: it also runs the tower once per prompt, which would hide this
            trainer_kwargs={"encode_video_once": once, "freeze_vision_tower": frozen, "shared_prefix": False},
        )
        rows = count_encoder_rows(trainer)
        if trainer.ref_model is not None:
            trainer.ref_model.model.visual.register_forward_hook(
                lambda m, a, o, rows=rows: rows.append(a[0].shape[0])
            )
        trainer.train()
        counts[once] = sum(rows)
    ratio = counts[True] / counts[False]
    # plain: generation + old-policy + reference + loss, each G rows per video
    assert ratio <= (1 / (3 * 8) if frozen else 1 / 8) * 1.05, (counts, ratio)


def test_group_shuffle_keeps_prompt_groups_whole():
    import trl.trainer.grpo_trainer as grpo_module

    from video_grpo.trainer import shuffle_whole_groups

    batch = {"ids": torch.arange(12), "names": [f"row{i}" for i in range(12)], "scalar": torch.tensor(3.0)}
    original = grpo_module.shuffle_sequence_dict
    with shuffle_whole_groups(4):
        shuffled = grpo_module.shuffle_sequence_dict(batch)
    assert grpo_module.shuffle_sequence_dict is original  # restored
    groups = shuffled["ids"].view(3, 4)
    assert sorted(groups[:, 0].tolist()) == [0, 4, 8] and (groups.diff(dim=1) == 1).all()
    assert shuffled["names"] == [f"row{i}" for i in shuffled["ids"].tolist()] and shuffled["scalar"] == 3.0
