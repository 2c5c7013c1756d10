"""DeepSpeed's Muon kernels compiled on their first call (video_grpo.runtime.deepspeed_imports), checked on stand-in
modules with a recording ``torch.compile``: nothing compiles at import, the first call compiles every function of the
group with its own options, and the compiled functions replace the stand-ins in the modules' globals."""

from __future__ import annotations

import sys
import types

import torch

from video_grpo.runtime import deepspeed_imports
from video_grpo.runtime.deepspeed_imports import compile_on_first_call, defer_muon_compile


def test_compiled_on_first_call_with_the_same_options(monkeypatch):
    compiled: list[tuple[str, dict]] = []

    def recording_compile(fn, **options):
        compiled.append((fn.__name__, options))

        def run(*args, **kwargs):
            return ("compiled", fn(*args, **kwargs))

        return run

    module = types.ModuleType("stand_in_muon")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(deepspeed_imports, "MUON_MODULES", (module.__name__,))
    stand_in = compile_on_first_call([])

    @stand_in
    def inner(x):
        return x + 1

    @stand_in(dynamic=False)
    def outer(x):
        return module.inner(x), "outer"

    module.inner, module.outer = inner, outer
    assert compiled == [] and outer.__name__ == "outer"  # nothing compiled at "import"
    monkeypatch.setattr(torch, "compile", recording_compile)
    assert outer(1) == (
        "compiled",
        (("compiled", 2), "outer"),
    )  # the call runs the compiled function, which sees inner's
    assert compiled == [("inner", {}), ("outer", {"dynamic": False})]
    assert module.inner is inner.compiled and module.outer is outer.compiled
    assert outer(2) == ("compiled", (("compiled", 3), "outer")) and len(compiled) == 2  # compiled once


def test_switched_off_or_imported_already(monkeypatch):
    monkeypatch.setenv(deepspeed_imports.ENV, "0")
    assert defer_muon_compile() is False
    monkeypatch.delenv(deepspeed_imports.ENV)
    monkeypatch.setitem(sys.modules, deepspeed_imports.MUON_MODULES[0], types.ModuleType("imported"))
    assert defer_muon_compile() is False


def test_with_real_deepspeed_inductor_is_not_imported_until_muon_runs():
    """What the deferral saves, on the installed DeepSpeed, in fresh processes: importing its Muon module imports
    ``torch._inductor`` (DeepSpeed's own import) unless :func:`defer_muon_compile` ran first."""
    import subprocess

    def inductor_imported(prefix: str) -> bool:
        code = f"import sys; {prefix}import deepspeed.runtime.zero.muon.muon_optimizer; print('torch._inductor' in sys.modules)"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip().splitlines()[-1] == "True"

    deferred = (
        "from video_grpo.runtime.deepspeed_imports import defer_muon_compile; assert defer_muon_compile(); "
    )
    assert inductor_imported("") and not inductor_imported(deferred)
