"""DeepSpeed's Muon kernels compiled when first called, not when DeepSpeed imports them.

DeepSpeed 0.19's ZeRO optimizers (stages 1-3) import ``deepspeed.runtime.zero.muon.muon_optimizer`` for an
``isinstance`` check whatever the run's optimizer is. That module's ``original_muon`` decorates three functions
with ``torch.compile`` at import, and ``torch.compile`` looks its inductor backend up there and then, which imports
``torch._inductor`` (its lowerings, flex attention's templates...): 2.5 CPU seconds per rank on a 2-core CPU
machine, paid by every rank of every DeepSpeed launch, for kernels that a run without Muon never calls (our runs
use TRL's AdamW).

:func:`defer_muon_compile` imports that module first, with ``torch.compile`` swapped for :func:`compile_on_first_call`
while it does: each decorated function is ``torch.compile``'d with the same arguments when the first of them is called, so a run
that uses Muon compiles the same kernels (on its first step instead of at import), and one that does not never
imports inductor for them. ``VIDEO_GRPO_DEFER_MUON_COMPILE=0`` switches it off (DeepSpeed's own import then).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

ENV = "VIDEO_GRPO_DEFER_MUON_COMPILE"  # "0": leave DeepSpeed's import (and compile at import) as it is
MUON_MODULES = ("deepspeed.runtime.zero.muon.original_muon", "deepspeed.runtime.zero.muon.muon_optimizer")


class CompiledOnFirstCall:
    """``torch.compile(fn, **options)``, made on the first call of any member of its ``group`` (all of them at once,
    under a lock) and called from then on. Each compiled function also replaces its deferred stand-in in the Muon
    modules' globals, so code that runs later (and Dynamo tracing one compiled function's call of another, as
    ``muon_update`` calls the Newton-Schulz iterations) sees what DeepSpeed's own import would have bound."""

    _lock = threading.Lock()

    def __init__(self, fn: Callable, options: dict[str, Any], group: list[CompiledOnFirstCall]) -> None:
        functools.update_wrapper(self, fn)
        self.fn, self.options, self.group = fn, options, group
        self.compiled: Callable | None = None
        group.append(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is None:
            with self._lock:
                for member in self.group:
                    member._compile()
        return self.compiled(*args, **kwargs)

    def _compile(self) -> None:
        if self.compiled is not None:
            return
        import torch

        self.compiled = torch.compile(self.fn, **self.options)
        for name in MUON_MODULES:
            module = sys.modules.get(name)
            for attribute, value in list(vars(module).items()) if module is not None else ():
                if value is self:
                    setattr(module, attribute, self.compiled)


def compile_on_first_call(group: list[CompiledOnFirstCall]) -> Callable:
    """A stand-in for ``torch.compile`` (as a decorator or a call) whose functions join ``group``."""

    def stand_in(model: Callable | None = None, **options: Any) -> Any:
        if model is None:
            return lambda fn: CompiledOnFirstCall(fn, options, group)
        return CompiledOnFirstCall(model, options, group)

    return stand_in


def defer_muon_compile() -> bool:
    """Import DeepSpeed's Muon module with its ``torch.compile`` calls deferred to their first call (see the module
    docstring); call it before the trainer builds the DeepSpeed engine. Whether it did: not when switched off, when
    the module is already imported, or when this DeepSpeed has no Muon module (a ``ModuleNotFoundError`` for that
    module or a package above it). Any other import error of the Muon module (a dependency of it missing, a name
    it imports gone) is raised: it is a broken DeepSpeed, not one without Muon."""
    if os.environ.get(ENV, "1") == "0" or any(name in sys.modules for name in MUON_MODULES):
        return False
    import torch

    original = torch.compile
    torch.compile = compile_on_first_call([])
    try:
        importlib.import_module(MUON_MODULES[1])
    except ModuleNotFoundError as err:
        if err.name not in _packages_of(MUON_MODULES[1]):
            raise
        return False  # a DeepSpeed without Muon (or none at all): nothing to defer
    finally:
        torch.compile = original
    return True


def _packages_of(module: str) -> set[str]:
    """``a.b.c`` -> ``{"a", "a.b", "a.b.c"}``: the names whose absence means ``module`` is absent."""
    parts = module.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}
