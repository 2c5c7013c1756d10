"""DeepSpeed start-up work our runs never use: its Muon kernels compiled when first called, not when DeepSpeed
imports them (:func:`defer_muon_compile`), and its CPU shared-memory comm op never built (:func:`skip_cpu_shm_comm_build`).

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

:func:`skip_cpu_shm_comm_build`: on DeepSpeed's CPU accelerator (our CPU twins, ``make demo``, the launched tests)
``deepspeed.init_distributed`` constructs ``deepspeed.comm.torch.TorchBackend``, whose ``__init__`` calls the module's
``build_shm_op()`` (DeepSpeed 0.19.8: ``deepspeed/comm/torch.py`` lines 47 and 207). That JIT-builds the C++ op
``deepspeed_shm_comm`` the first time in a Python environment (about 85-100 CPU s on this 2-core machine, paid by
the first launched test of every fresh clone: a one-process ``init_distributed`` with an empty extensions folder
took 102 CPU s with it, 3.6 without) and loads it after (0.1 s). The op serves one thing only:
``TorchBackend.inference_all_reduce`` (torch.py line 292, called by the tensor-parallel layers of
``deepspeed/module_inject/layers.py``, DeepSpeed inference's and AutoTP's), which without it takes its own fallback,
``torch.distributed.all_reduce`` (torch.py lines 293-304: ``torch.ops.deepspeed.inference_all_reduce_`` is
registered only by that op). ZeRO's collectives (all_reduce, all_gather, reduce_scatter...) go through
``torch.distributed`` whatever it holds, so a ZeRO run (ours; we use no AutoTP) computes the same with or without
it. ``VIDEO_GRPO_CPU_SHM_COMM=1`` builds it as DeepSpeed does (in the environment or the recipe's ``env:`` block:
:func:`before_parsing` sets that block first).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from video_grpo.runtime.launch_env import deepspeed_launch

ENV = "VIDEO_GRPO_DEFER_MUON_COMPILE"  # "0": leave DeepSpeed's import (and compile at import) as it is
MUON_MODULES = ("deepspeed.runtime.zero.muon.original_muon", "deepspeed.runtime.zero.muon.muon_optimizer")
SHM_ENV = "VIDEO_GRPO_CPU_SHM_COMM"  # "1": build DeepSpeed's CPU shared-memory comm op, as DeepSpeed does
SHM_MODULE = "deepspeed.comm.torch"  # its TorchBackend.__init__ calls this module's build_shm_op()


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


def no_shm_op() -> None:
    """Stands in for ``deepspeed.comm.torch.build_shm_op``: no shared-memory op, as on a platform DeepSpeed builds
    none for; ``TorchBackend`` then keeps ``shm_comm_op = None`` (see the module docstring)."""
    return None


def recipe_of(args: list[str]) -> dict:
    """The ``--config`` YAML mapping as ``TrlParser.parse_args_and_config`` will read it (the first ``--config``,
    then its path); empty without one. A file that is missing or not a mapping is left for the parser to report."""
    if "--config" not in args or args.index("--config") + 1 >= len(args):
        return {}
    path = args[args.index("--config") + 1]
    if not os.path.isfile(path):
        return {}
    import yaml

    with open(path, encoding="utf-8") as file:
        recipe = yaml.safe_load(file)
    return recipe if isinstance(recipe, dict) else {}


def deepspeed_requested(args: list[str], recipe: dict) -> bool:
    """Whether this run will use DeepSpeed, from what exists before its arguments are parsed: an ``accelerate
    launch`` with a DeepSpeed config (``ACCELERATE_USE_DEEPSPEED``), a ``--deepspeed`` flag, or a ``deepspeed`` field
    in the recipe. Reads no DeepSpeed module."""
    if deepspeed_launch():
        return True
    if any(arg == "--deepspeed" or arg.startswith("--deepspeed=") for arg in args):
        return True
    return bool(recipe.get("deepspeed"))


def before_parsing(args: list[str]) -> bool:
    """What ``grpo`` and ``sft`` run before their ``TrlParser``: the recipe's ``env:`` block set first, as the
    parser sets it (it sets the same values again), so that DeepSpeed, which :func:`skip_cpu_shm_comm_build`
    imports, and the switch see what the run will see; then, for a DeepSpeed run, that hook. Whether it skipped
    the build."""
    recipe = recipe_of(args)
    env = recipe.get("env", {})
    for key, value in env.items() if isinstance(env, dict) else ():
        os.environ[key] = str(value)
    return deepspeed_requested(args, recipe) and skip_cpu_shm_comm_build()


def shm_comm_build_skipped() -> bool:
    """Whether this process's DeepSpeed comm module holds :func:`no_shm_op` (for the run's log, written once
    logging is set up, after parsing)."""
    module = sys.modules.get(SHM_MODULE)
    return module is not None and getattr(module, "build_shm_op", None) is no_shm_op


def skip_cpu_shm_comm_build() -> bool:
    """On DeepSpeed's CPU accelerator, make ``deepspeed.comm.torch.build_shm_op`` return None (:func:`no_shm_op`),
    so that ``deepspeed.init_distributed`` neither builds nor loads the ``deepspeed_shm_comm`` op that only DeepSpeed
    inference uses (see the module docstring). Call it before the training arguments are parsed, and only for a run
    that uses DeepSpeed (it imports ``deepspeed.comm``): their ``__post_init__`` makes accelerate's ``PartialState``,
    which calls ``init_distributed`` itself on a GPU, and on a launched CPU rank without ``use_cpu``. With
    ``use_cpu`` (our twins; parse_args measured to call no ``build_shm_op``) it makes a gloo group of its own, and
    ``TorchBackend`` comes later, with ``deepspeed.initialize`` or ZeRO-3's ``zero.Init``. It imports DeepSpeed, which
    picks its accelerator then: :func:`before_parsing` sets the recipe's ``env:`` block first. Whether it did:
    not when ``VIDEO_GRPO_CPU_SHM_COMM=1``, on another accelerator, or without DeepSpeed installed."""
    if os.environ.get(SHM_ENV, "0") == "1":
        return False
    try:  # by name: `import deepspeed.comm.torch as m` gives torch itself (deepspeed.comm re-exports it)
        module = importlib.import_module(SHM_MODULE)
    except ModuleNotFoundError as err:
        if err.name not in _packages_of(SHM_MODULE):
            raise
        return False
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return False
    module.build_shm_op = no_shm_op  # TorchBackend.__init__ reads the module global when it runs
    return True
