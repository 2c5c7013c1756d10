"""Shared-prefix forwards (video_grpo.inputs.prefix): each prompt once per micro-batch, exactly the plain path's numbers.

Every comparison runs the real trainer twice on the same rows, ``shared_prefix`` off and on, in fp32: the
old-policy and reference log-probs from ``_generate_and_score_completions``, then the loss forward and its
backward (every parameter's gradient, vision tower included). Each also counts the token positions the
packed forwards carried, so a test cannot pass with the optimisation silently off.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from peft import LoraConfig

from video_grpo.data.dataset import build_dataset
from video_grpo.inputs.prefix import pack_rows, segment_mask
from video_grpo.inputs.processing import video_row_keys

from .test_trainer import SAMPLING, make_trainer

QWEN3_SAMPLING = dataclasses.replace(SAMPLING, min_pixels=1024, max_pixels=64 * 64, size_multiple=32)


def family_dataset(train_file, family: str):
    return build_dataset(train_file, sampling=SAMPLING if family == "qwen2_5_vl" else QWEN3_SAMPLING)


LOGP_TOL, LOSS_RTOL, GRAD_RTOL = 1e-5, 1e-6, 1e-4


@pytest.fixture(scope="module")
def dataset(train_file):
    return build_dataset(train_file, sampling=SAMPLING)


def micro_batch(output: dict, rows: slice) -> dict:
    """Rows of a generation batch, as TRL's split hands them to the loss."""

    def take(value):
        if isinstance(value, torch.Tensor) and value.ndim > 0 or isinstance(value, list):
            return value[rows]
        return value

    return {key: take(value) for key, value in output.items()}


def generate(trainer, shared: bool, seed: int = 0) -> dict:
    trainer.shared_prefix = trainer.shared_prefill = shared
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions(batch)


def loss_and_grads(trainer, inputs: dict, shared: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    trainer.shared_prefix = shared
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def prefill_rows(model) -> list[int]:
    """Rows of every language-model forward without grad that carries more than one token (a prefill)."""
    rows = []

    def record(module, args, kwargs):
        embeds = kwargs["inputs_embeds"]
        if embeds.shape[1] > 1 and kwargs.get("use_cache"):  # not the scoring forwards, which cache nothing
            rows.append(embeds.shape[0])

    language = (model.get_base_model() if hasattr(model, "get_base_model") else model).model.language_model
    language.register_forward_pre_hook(record, with_kwargs=True)
    return rows


def assert_same_grads(shared: dict, plain: dict, tower_trains: bool) -> None:
    assert plain and shared.keys() == plain.keys()
    assert any(".visual." in name for name in plain) == tower_trains
    for name, grad in plain.items():
        scale = grad.abs().max().clamp(min=1e-12)
        error = (shared[name] - grad).abs().max() / scale
        assert error <= GRAD_RTOL, f"{name}: relative gradient error {error:.2e}"


def assert_same_loss_and_grads(trainer, inputs: dict, tower_trains: bool = True) -> None:
    # Tiny random models rarely earn different rewards within a group; give the rows real advantages so the
    # loss and its gradients are not zero.
    inputs = {**inputs, "advantages": torch.linspace(-1.0, 1.5, inputs["advantages"].shape[0])}
    loss_plain, grads_plain = loss_and_grads(trainer, inputs, shared=False)
    before = list(trainer.prefix_positions)
    loss_shared, grads_shared = loss_and_grads(trainer, inputs, shared=True)
    assert trainer.prefix_positions[1] > before[1], "the loss forward did not pack"
    assert loss_plain.abs() > 1e-3
    assert abs(loss_shared - loss_plain) <= LOSS_RTOL * abs(loss_plain), (loss_shared, loss_plain)
    assert_same_grads(grads_shared, grads_plain, tower_trains)


CASES = {
    # two prompts per micro-batch, reference copy, old-policy pass, two micro-batches per generation
    "beta_ref_copy-num_iterations2-two_prompts": dict(
        overrides={
            "beta": 0.04,
            "num_iterations": 2,
            "steps_per_generation": 2,
            "per_device_train_batch_size": 4,
            "num_generations": 2,
            "gradient_checkpointing": True,
        }
    ),
    # half a group per micro-batch, LoRA (reference = adapter off), frozen tower
    "beta_lora-half_group-frozen_tower": dict(
        overrides={
            "beta": 0.04,
            "steps_per_generation": 2,
            "per_device_train_batch_size": 2,
            "num_generations": 4,
        },
        trainer_kwargs={
            "freeze_vision_tower": True,
            "peft_config": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        },
    ),
    # TimeLens-7B's layout: each temporal patch its own block, led by its time as text
    "beta_ref_copy-qwen2_5_vl_text_timestamps": dict(
        overrides={"beta": 0.04, "per_device_train_batch_size": 4, "num_generations": 2, "num_iterations": 2},
        trainer_kwargs={"frame_timestamps_in_text": True},
    ),
    "beta0-qwen3_vl": dict(
        family="qwen3_vl",
        overrides={"per_device_train_batch_size": 4, "num_generations": 4, "num_iterations": 2},
    ),
}
# Qwen3.5 (Gated DeltaNet state forked after the stem): the same two cases; LoRA also on the linear-attention
# projections, so their adapters' gradients are compared too
CASES["qwen3_5-beta_ref_copy-num_iterations2-two_prompts"] = dict(
    CASES["beta_ref_copy-num_iterations2-two_prompts"], family="qwen3_5"
)
CASES["qwen3_5-beta_lora-half_group-frozen_tower"] = dict(
    CASES["beta_lora-half_group-frozen_tower"],
    family="qwen3_5",
    trainer_kwargs={
        "freeze_vision_tower": True,
        "peft_config": LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "in_proj_qkv", "in_proj_a", "out_proj"]
        ),
    },
)


@pytest.mark.parametrize("case", list(CASES))
def test_shared_prefix_matches_plain_path(case, tiny_model_dir, family_model, dataset, train_file, tmp_path):
    spec = CASES[case]
    model_dir = family_model(spec["family"]) if "family" in spec else tiny_model_dir
    data = dataset if "family" not in spec else family_dataset(train_file, spec["family"])
    trainer = make_trainer(
        model_dir,
        data,
        tmp_path,
        max_completion_length=12,
        trainer_kwargs=spec.get("trainer_kwargs"),
        **spec["overrides"],
    )
    assert trainer.shared_prefix and trainer.shared_prefill
    prefills = prefill_rows(trainer.model)
    plain = generate(trainer, shared=False)
    plain_prefills = list(prefills)
    shared = generate(trainer, shared=True)
    # the same sampled answers (same seed), generated with one prefill row per prompt instead of one per answer
    assert torch.equal(plain["completion_ids"], shared["completion_ids"])
    rows = plain["completion_ids"].shape[0]
    assert plain_prefills == [rows] and prefills[1:] == [rows // trainer.num_generations], prefills
    compared = 0
    for key in ("old_per_token_logps", "ref_per_token_logps"):
        if plain.get(key) is not None:
            torch.testing.assert_close(shared[key], plain[key], rtol=0, atol=LOGP_TOL)
            compared += 1
    assert compared == (
        int(trainer.num_iterations > 1 or trainer.args.steps_per_generation > 1) + int(trainer.beta != 0)
    )
    assert trainer.prefix_positions[1] < trainer.prefix_positions[0]
    size = trainer.args.per_device_train_batch_size
    for start in range(0, plain["completion_ids"].shape[0], size):
        assert_same_loss_and_grads(
            trainer,
            micro_batch(plain, slice(start, start + size)),
            tower_trains=not spec.get("trainer_kwargs", {}).get("freeze_vision_tower"),
        )


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"])
def test_answer_shapes_and_entropies(family, family_model, train_file, tmp_path):
    """One micro-batch with a 1-token answer, an EOS-terminated one, a clipped one and a fully masked one."""
    trainer = make_trainer(
        family_model(family),
        family_dataset(train_file, family),
        tmp_path,
        max_completion_length=10,
        per_device_train_batch_size=4,
        num_generations=4,
    )
    inputs = micro_batch(generate(trainer, shared=False), slice(0, 4))
    ids, mask = inputs["completion_ids"].clone(), torch.zeros_like(inputs["completion_mask"])
    eos = trainer.eos_token_ids[0]
    mask[0, :1] = 1  # one token
    ids[1, 3] = eos
    mask[1, :4] = 1  # EOS-terminated
    mask[2, :] = 1  # clipped at max_completion_length
    ids[2] = torch.where(ids[2] == eos, ids[2] + 1, ids[2])
    # row 3 stays fully masked, as mask_truncated_completions leaves a clipped answer
    inputs.update(completion_ids=ids, completion_mask=mask)
    full_ids = torch.cat([inputs["prompt_ids"], ids], dim=1)
    full_mask = torch.cat([inputs["prompt_mask"], mask], dim=1)
    results = {}
    for shared in (False, True):
        trainer.shared_prefix = shared
        trainer._video_rows = {key: inputs[key] for key in video_row_keys(trainer.family)}
        with torch.no_grad():
            results[shared] = trainer._get_per_token_logps_and_entropies(
                trainer.model, full_ids, full_mask, ids.shape[1], compute_entropy=True
            )
        trainer._video_rows = None
    for got, want in zip(results[True][:2], results[False][:2], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=LOGP_TOL)
    assert (results[True][0][3] == 0).all() and (results[True][0][0, 1:] == 0).all()
    assert_same_loss_and_grads(trainer, inputs)


def no_leak(trainer, inputs: dict) -> torch.Tensor:
    """Largest change in rows 1.. log-probs when row 0's answer tokens are replaced."""

    def logps(completion_ids):
        full_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        full_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        trainer._video_rows = {
            key: inputs[key]
            for key in inputs
            if key in ("video_pixels", "video_grid_thw", "second_per_grid_ts")
        }
        with torch.no_grad():
            out = trainer._get_per_token_logps_and_entropies(
                trainer.model, full_ids, full_mask, completion_ids.shape[1]
            )[0]
        trainer._video_rows = None
        return out

    ids = inputs["completion_ids"]
    changed = ids.clone()
    changed[0] = (changed[0] + 7) % 100 + 20
    return (logps(changed)[1:] - logps(ids)[1:]).abs().max()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_no_answer_sees_another(family, family_model, train_file, tmp_path):
    """Rows 1.. of one group must not move when row 0's answer changes, in every family, with the default."""
    data = family_dataset(train_file, family)
    trainer = make_trainer(
        family_model(family),
        data,
        tmp_path,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
    )
    inputs = micro_batch(generate(trainer, shared=trainer.shared_prefix), slice(0, 4))
    inputs["completion_mask"] = torch.ones_like(inputs["completion_mask"])
    packed_before = trainer.prefix_positions[1]
    assert trainer.shared_prefix and trainer.shared_prefill
    assert no_leak(trainer, inputs) == 0
    assert trainer.prefix_positions[1] > packed_before


def test_packing_without_the_state_fork_would_leak(family_model, train_file, tmp_path):
    """Why Qwen3.5 needs video_grpo.inputs.state_fork: packed without it, a Gated DeltaNet state carries row 0's answer
    into the others."""
    data = family_dataset(train_file, "qwen3_5")
    trainer = make_trainer(
        family_model("qwen3_5"),
        data,
        tmp_path,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
    )
    inputs = micro_batch(generate(trainer, shared=False), slice(0, 4))
    inputs["completion_mask"] = torch.ones_like(inputs["completion_mask"])
    trainer.shared_prefix = True
    assert no_leak(trainer, inputs) == 0
    trainer._fork_state = False  # what the state fork prevents
    assert no_leak(trainer, inputs) > 1e-4


def test_unforkable_state_layers_are_refused(family_model, train_file, tmp_path, monkeypatch):
    """A stateful layer type the family does not fork is still refused (by default off with a warning; forced on,
    an error naming the setting)."""
    from video_grpo.inputs import families

    monkeypatch.setattr(families, "QWEN3_5", dataclasses.replace(families.QWEN3_5, forkable_state=()))
    monkeypatch.setitem(families.FAMILIES, "qwen3_5", families.QWEN3_5)
    data = family_dataset(train_file, "qwen3_5")
    with pytest.raises(
        ValueError, match="shared_prefix: cannot be exact here: .*linear_attention.*shared_prefix: false"
    ):
        make_trainer(family_model("qwen3_5"), data, tmp_path, trainer_kwargs={"shared_prefix": True})
    trainer = make_trainer(family_model("qwen3_5"), data, tmp_path)
    assert not trainer.shared_prefix and not trainer.shared_prefill


def test_segment_mask():
    segments = torch.tensor([[-1, -1, 0, 0, 1, 1, -2]])
    allowed = segment_mask(segments)[0, 0].int()
    assert allowed.tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 1, 0],
        [1, 1, 0, 0, 0, 0, 1],
    ]


def test_unpackable_layout_is_reported_not_guessed():
    """A prompt padded on the right is not the TRL layout: pack_rows declines instead of guessing."""
    ids = torch.tensor([[5, 6, 7, 0, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 0, 1, 1]])
    rows = {"video_pixels": [torch.zeros(1, 1)], "video_grid_thw": torch.tensor([[1, 2, 2]])}
    assert pack_rows(ids, mask, 2, rows, slice(0, 1), None, 99, 0) is None


@pytest.mark.parametrize(
    ("family", "attention"),
    [("qwen2_5_vl", "flash_attention_2"), ("qwen3_vl", "flex_attention"), ("qwen3_5", "flash_attention_2")],
)
def test_recipe_validation_refuses_before_the_model_loads(family, attention, family_model):
    """flash_attention_2 and flex_attention stay refused in every family: they take no custom 4-D attention
    mask, which keeps the answers apart in the attention layers (Qwen3.5's included: its Gated DeltaNet layers
    fork their state, its full-attention layers still need the mask). sdpa is accepted, Qwen3.5 included."""
    from types import SimpleNamespace

    from video_grpo.configs import check_shared_prefix

    model_args = SimpleNamespace(
        model_name_or_path=str(family_model(family)), model_revision=None, attn_implementation=attention
    )
    with pytest.raises(
        ValueError,
        match="shared_prefix: true cannot be exact here: .*takes no custom 4-D attention mask.*shared_prefix: "
        "false.*attn_implementation: sdpa",
    ):
        check_shared_prefix(model_args)
    for supported in ("qwen2_5_vl", "qwen3_5"):
        check_shared_prefix(
            SimpleNamespace(
                model_name_or_path=str(family_model(supported)),
                model_revision=None,
                attn_implementation="sdpa",
            )
        )  # supported: no error


def test_eager_mask_is_in_the_model_dtype(tiny_model_dir, dataset, tmp_path):
    """Eager attention adds the packed mask to the scores: a float32 mask would promote a bf16 model's
    (rows, heads, L, L) scores to float32. It is built in the model's dtype, with that dtype's minimum."""
    trainer = make_trainer(
        tiny_model_dir,
        dataset,
        tmp_path,
        per_device_train_batch_size=4,
        num_generations=4,
        model_init_kwargs={"attn_implementation": "eager", "dtype": "bfloat16"},
    )
    inputs = micro_batch(generate(trainer, shared=True), slice(0, 4))
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], torch.ones_like(inputs["completion_mask"])], dim=1)
    trainer._video_rows = {
        key: inputs[key] for key in ("video_pixels", "video_grid_thw", "second_per_grid_ts")
    }
    packed = trainer._pack(ids, mask, inputs["completion_ids"].shape[1], slice(0, 4))
    trainer._video_rows = None
    additive = packed.model_inputs["attention_mask"]
    assert additive.dtype == torch.bfloat16
    assert additive.max() == 0 and additive.min() == torch.finfo(torch.bfloat16).min


def test_qwen3_5_4b_positions_are_close_to_ideal():
    """At Qwen3.5-4B's widths (configs/models/qwen3_5_4b.json), ~2,000 visual tokens and G = 8, the packed loss
    forward carries (P + sum C) / (G x (P + C_max)) of the plain path's positions, within 5%, with the state
    fork on (the count needs the packing only: the model is built on the meta device)."""
    from video_grpo.bench.shared_prefix_qwen3_5 import packed_positions

    counted = packed_positions("4b", 2048, 8)
    assert counted["forked"] and counted["visual_tokens"] >= 2000
    ratio = counted["packed"] / counted["plain"]
    assert abs(ratio - counted["ideal"]) <= 0.05 * counted["ideal"], counted
