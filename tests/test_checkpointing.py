"""The input-gradient hook leak (video_grpo.runtime.checkpointing): TRL switches checkpointing off and on around every
generation and every no-grad log-prob pass, and transformers adds a hook each time it is switched on.

Each case cycles checkpointing as TRL 1.16 does (``gradient_checkpointing_disable`` then
``gradient_checkpointing_enable`` with the run's kwargs), 12 times, and counts the hooks; then it checks that the
one hook left still does its job: under reentrant checkpointing with LoRA, the adapters before the last layer get
gradients only through it. The training runs that count hooks step by step are in tests/test_long_run.py.
"""

from __future__ import annotations

import pickle
from copy import deepcopy

import pytest
import torch
from transformers import AutoModelForImageTextToText, PreTrainedModel

from video_grpo.runtime.checkpointing import input_grad_hooks, keep_one_input_grad_hook

CYCLES = 12


def cycle(model, kwargs) -> None:
    """What TRL's ``unwrap_model_for_generation`` does to a checkpointed model around one generation."""
    model.gradient_checkpointing_disable()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def test_transformers_still_leaks_a_hook_per_switch(tiny_model_dir):
    """The upstream behaviour the workaround exists for. If this fails, transformers no longer adds a hook each
    time checkpointing is switched on: remove video_grpo.runtime.checkpointing and its call in the trainer."""
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for _ in range(3):
        cycle(model, {"use_reentrant": False})
    assert input_grad_hooks(model) == [4, 4]  # the token and the vision patch embeddings


def lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_one_hook_however_often_checkpointing_is_switched(family, reentrant, peft, family_model):
    model = AutoModelForImageTextToText.from_pretrained(family_model(family))
    if peft:
        model = lora(model)
    kwargs = {"use_reentrant": reentrant}
    for _ in range(2):  # two hooks already, as after TRL's __init__
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    keep_one_input_grad_hook(model)
    # one per input embedding module (Qwen2.5-VL's vision patch embedding is one too)
    one_each = [1] * len(input_grad_hooks(model))
    assert input_grad_hooks(model) == one_each
    counts = []
    for _ in range(CYCLES):
        cycle(model, kwargs)
        counts.append(input_grad_hooks(model))
    assert counts == [one_each] * CYCLES
    keep_one_input_grad_hook(model)  # idempotent: a second install wraps nothing twice
    cycle(model, kwargs)
    assert input_grad_hooks(model) == one_each
    copy = deepcopy(model)  # the copy's switch keeps the copy's hooks, and leaves the original's alone
    cycle(copy, kwargs)
    assert input_grad_hooks(copy) == one_each and input_grad_hooks(model) == one_each
    bound = [
        m.enable_input_require_grads.module is m for m in copy.modules() if isinstance(m, PreTrainedModel)
    ]
    assert bound and all(bound)


def test_lora_with_reentrant_checkpointing_still_gets_gradients(tiny_model_dir):
    """The hook that is kept is the one reentrant checkpointing needs: without any, the checkpointed layers'
    inputs carry no grad, and the adapters inside them get none (checked below by removing it: the loss then has
    no graph)."""
    model = lora(AutoModelForImageTextToText.from_pretrained(tiny_model_dir))
    kwargs = {"use_reentrant": True}
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    keep_one_input_grad_hook(model)
    for _ in range(CYCLES):
        cycle(model, kwargs)
    model.train()
    ids = torch.randint(0, 100, (2, 12))

    def adapter_grads() -> int:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        return sum(
            p.grad is not None and bool(p.grad.abs().sum() > 0)
            for name, p in model.named_parameters()
            if "lora_B" in name and "language_model.layers.0." in name  # lora_A: zero grad while B is 0
        )

    assert adapter_grads() == 2  # q_proj and v_proj of the first layer
    assert input_grad_hooks(model) == [1, 1]
    for module in model.modules():  # the control: drop the hook, and the first layer's adapters get nothing
        for key in [k for k, h in module._forward_hooks.items() if "make_inputs_require_grads" in str(h)]:
            del module._forward_hooks[key]
    assert input_grad_hooks(model) == [0, 0]
    with pytest.raises(RuntimeError, match="does not require grad"), pytest.warns(UserWarning):
        adapter_grads()  # every layer checkpointed, no input with grad: the loss has no graph at all


def test_a_model_with_the_keeper_pickles(tiny_model_dir):
    """torch.save(model) pickles it: the keeper must not stop that (transformers' own hook, a local function, does
    while checkpointing is on; the trainer installs the keeper whatever the setting)."""
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    keep_one_input_grad_hook(model)
    again = pickle.loads(pickle.dumps(model))
    again.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cycle(again, {"use_reentrant": False})
    assert set(input_grad_hooks(again)) == {1}
