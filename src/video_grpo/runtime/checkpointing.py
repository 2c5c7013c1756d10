"""One input-gradient hook for the whole run, however often checkpointing is switched off and on.

Gradient checkpointing needs the input embeddings' output to require grad (or a checkpointed segment whose
inputs carry none would give the frozen weights before it, and LoRA's adapters, no gradient): transformers does
it with a forward hook on the input embeddings, ``make_inputs_require_grads``, registered by
``enable_input_require_grads``.

**The upstream behaviour worked around here** (transformers 5.23-5.24 with TRL 1.16):

- TRL's ``unwrap_model_for_generation`` turns checkpointing off before each generation and on after it, and its
  ``disable_gradient_checkpointing`` does the same around the old-policy / reference log-probs: two cycles a step.
- transformers' ``_activation_checkpointing_enable`` calls ``enable_input_require_grads`` every time (for any
  model whose ``main_input_name`` is ``input_ids``), which registers one more hook and forgets the handles of the
  earlier ones; ``_activation_checkpointing_disable`` removes hooks only for models with transformers' own PEFT
  integration loaded (``_hf_peft_config_loaded``), not for a ``peft.PeftModel``, nor without PEFT.

So the embeddings carry 1 + 2 x steps hooks: 20,001 after 10,000 steps, each run on every embedding call, and a
compiled decode step, whose guards count a module's hooks, recompiles at every step until torch's limit stops it.
:func:`keep_one_input_grad_hook` makes each ``enable_input_require_grads`` of the model leave exactly one such hook
per embedding module. ``tests/test_checkpointing.py`` fails when transformers stops leaking, so the workaround can
go then.
"""

from __future__ import annotations

import torch

HOOK_QUALNAME = "enable_input_require_grads.<locals>.make_inputs_require_grads"


def _is_input_grad_hook(hook) -> bool:
    return getattr(hook, "__qualname__", "").endswith(HOOK_QUALNAME)


def _embedding_modules(model) -> list[torch.nn.Module]:
    """The input embedding module of every ``PreTrainedModel`` in ``model`` (one entry per distinct module)."""
    from transformers import PreTrainedModel

    found: dict[int, torch.nn.Module] = {}
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            try:
                embeddings = module.get_input_embeddings()
            except NotImplementedError:
                continue
            if isinstance(embeddings, torch.nn.Module):
                found.setdefault(id(embeddings), embeddings)
    return list(found.values())


def input_grad_hooks(model) -> list[int]:
    """How many ``make_inputs_require_grads`` forward hooks each input embedding module of the model carries (the
    language model's token embeddings, and the vision tower's patch embedding, which is a ``PreTrainedModel``'s
    input embedding too)."""
    return [
        sum(_is_input_grad_hook(hook) for hook in module._forward_hooks.values())
        for module in _embedding_modules(model)
    ]


def _keep_newest(model) -> None:
    """Remove every ``make_inputs_require_grads`` hook of each input embedding module but the newest."""
    for module in _embedding_modules(model):
        ids = [key for key, hook in module._forward_hooks.items() if _is_input_grad_hook(hook)]
        for key in ids[:-1]:
            for table in (
                module._forward_hooks,
                module._forward_hooks_with_kwargs,
                module._forward_hooks_always_called,
            ):
                table.pop(key, None)


class _EnableKeepingOne:
    """A module's ``enable_input_require_grads``: the class's, then one hook per embedding module. An object
    holding its module (not a closure, nor a method bound under a name the module lacks), so a deep copy of the
    model binds the copy and a pickled model loads again."""

    def __init__(self, module) -> None:
        self.module = module

    def __call__(self) -> None:
        type(self.module).enable_input_require_grads(self.module)
        _keep_newest(self.module)


def keep_one_input_grad_hook(model) -> None:
    """Make every ``enable_input_require_grads`` of ``model`` (a ``PreTrainedModel`` or a PEFT model around one)
    leave one input-gradient hook per embedding module, and drop the extra ones already there. Idempotent."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel) and "enable_input_require_grads" not in vars(module):
            module.enable_input_require_grads = _EnableKeepingOne(module)
    _keep_newest(model)
