"""DeepSpeed start-up work our runs never use (video_grpo.runtime.deepspeed_imports).

Muon's kernels compiled on their first call: checked on stand-in modules with a recording ``torch.compile`` (nothing
compiles at import, the first call compiles every function of the group with its own options, the compiled
functions replace the stand-ins in the modules' globals), and once on the installed DeepSpeed in a fresh process
(inductor not imported by the deferred import; the real deferred functions traced by Dynamo on their first call,
with a recording backend instead of inductor, and equal to the same functions run eagerly).

The CPU shared-memory comm op not built: on the installed DeepSpeed in a fresh process with an empty
``TORCH_EXTENSIONS_DIR``, a real ``deepspeed.init_distributed`` after the hook builds nothing; switched off, the hook
leaves DeepSpeed's own ``build_shm_op``; the entry points call it before their arguments are parsed, and only for a
run that uses DeepSpeed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from video_grpo.runtime import deepspeed_imports
from video_grpo.runtime.deepspeed_imports import (
    before_parsing,
    compile_on_first_call,
    deepspeed_requested,
    defer_muon_compile,
    recipe_of,
)

SRC = str(Path(deepspeed_imports.__file__).resolve().parents[2])


def run_fresh(code: str, env: dict[str, str] | None = None) -> list[str]:
    """``code`` in a fresh Python (this tree's ``src`` first on the path); its stdout's lines."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])),
        **(env or {}),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=environment
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()


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


def test_switched_off_imports_nothing(monkeypatch):
    """With the Muon modules absent (whatever other tests of this worker imported), the switch alone stops it."""
    for name in deepspeed_imports.MUON_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setenv(deepspeed_imports.ENV, "0")
    before, compile_before = set(sys.modules), torch.compile
    assert defer_muon_compile() is False
    assert set(sys.modules) == before and torch.compile is compile_before


def test_imported_already_left_alone(monkeypatch):
    """Switched on, one Muon module imported (a stand-in), the other absent: it imports nothing."""
    monkeypatch.delenv(deepspeed_imports.ENV, raising=False)
    monkeypatch.delitem(sys.modules, deepspeed_imports.MUON_MODULES[1], raising=False)
    monkeypatch.setitem(sys.modules, deepspeed_imports.MUON_MODULES[0], types.ModuleType("imported"))
    before, compile_before = set(sys.modules), torch.compile
    assert defer_muon_compile() is False
    assert set(sys.modules) == before and torch.compile is compile_before


@pytest.fixture
def stand_in_deepspeed(tmp_path, monkeypatch):
    """A package ``stand_in_ds`` under ``tmp_path`` on the path; its modules are dropped from ``sys.modules`` after."""
    (tmp_path / "stand_in_ds").mkdir()
    (tmp_path / "stand_in_ds" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(deepspeed_imports.ENV, raising=False)
    yield tmp_path / "stand_in_ds"
    for name in [name for name in sys.modules if name.split(".")[0] == "stand_in_ds"]:
        del sys.modules[name]


def test_a_deepspeed_without_muon_has_nothing_to_defer(stand_in_deepspeed, monkeypatch):
    """The Muon module, or a package above it, not found: absence, not an error."""
    compile_before = torch.compile
    for muon in ("stand_in_ds.muon.muon_optimizer", "no_such_deepspeed.muon.muon_optimizer"):
        monkeypatch.setattr(deepspeed_imports, "MUON_MODULES", (muon.replace("optimizer", "original"), muon))
        assert defer_muon_compile() is False and torch.compile is compile_before


@pytest.mark.parametrize(
    "body",
    ["import video_grpo_no_such_dependency\n", "from torch import no_such_name\n"],
    ids=["dependency-missing", "name-missing"],
)
def test_a_broken_muon_module_is_raised(stand_in_deepspeed, monkeypatch, body):
    """An import error inside the Muon module (a dependency of it missing, a name gone) is a broken DeepSpeed, not
    one without Muon: raised, with ``torch.compile`` given back."""
    (stand_in_deepspeed / "muon_optimizer.py").write_text(body)
    monkeypatch.setattr(
        deepspeed_imports, "MUON_MODULES", ("stand_in_ds.original_muon", "stand_in_ds.muon_optimizer")
    )
    compile_before = torch.compile
    with pytest.raises(ImportError) as raised:
        defer_muon_compile()
    assert "no_such" in str(raised.value) and torch.compile is compile_before


DEFERRED_COMPILE = """
import sys, torch
from video_grpo.runtime.deepspeed_imports import CompiledOnFirstCall, defer_muon_compile
assert defer_muon_compile()
from deepspeed.runtime.zero.muon import original_muon as muon
print("inductor imported:", "torch._inductor" in sys.modules)
names = ("zeropower_via_newtonschulz5", "zeropower_via_gram_newtonschulz", "muon_update")
stand_ins = {name: getattr(muon, name) for name in names}
assert all(isinstance(f, CompiledOnFirstCall) and f.options == {} for f in stand_ins.values()), stand_ins
torch.compile(lambda x: x)  # what each of DeepSpeed's three decorations does at its own import
print("inductor imported by a torch.compile:", "torch._inductor" in sys.modules)
graphs = []
def recording_backend(gm, example_inputs):  # Dynamo's graphs, run as they are: no inductor compile
    graphs.append(gm)
    return gm.forward
compile = torch.compile
torch.compile = lambda model, **options: compile(model, backend=recording_backend, **options)
generator = torch.Generator().manual_seed(0)
grad, momentum = torch.randn(8, 4, generator=generator), torch.randn(8, 4, generator=generator)
for method in ("standard", "gram"):
    compiled = muon.muon_update(grad.clone(), momentum.clone(), ns_method=method)
    with torch.compiler.set_stance("force_eager"):
        eager = muon.muon_update(grad.clone(), momentum.clone(), ns_method=method)
    assert torch.equal(compiled, eager) and compiled.abs().sum() > 0, (method, compiled, eager)
for name, stand_in in stand_ins.items():  # each global is now torch.compile of DeepSpeed's own function
    assert getattr(muon, name) is stand_in.compiled and stand_in.compiled._torchdynamo_orig_callable is stand_in.fn
print("graphs:", len(graphs))
"""


def test_with_real_deepspeed_inductor_is_not_imported_until_muon_runs():
    """What the deferral saves, on the installed DeepSpeed, in a fresh process: its Muon module imported after
    :func:`defer_muon_compile` leaves ``torch._inductor`` unimported, and each of its three functions was given to
    ``torch.compile`` at that import (they are the deferred stand-ins), whose default call imports inductor (checked
    next, in the same process, before anything else compiles: DeepSpeed's own import is those three calls; it
    was a process of its own, 8.4 CPU s).
    Then the deferred functions' first call compiles them for real (Dynamo traces ``muon_update`` and the
    Newton-Schulz iterations it calls) and gives what they give run eagerly. The backend is a recording one, not
    inductor: inductor's compile of the ``standard`` path alone took 16 CPU s more on this 2-core machine (19.5 s
    for the whole process, against this one's 8), and its bf16 results differ from eager ones in the last bits."""
    lines = run_fresh(DEFERRED_COMPILE)
    assert lines[-3:-1] == ["inductor imported: False", "inductor imported by a torch.compile: True"]
    assert lines[-1].startswith("graphs: ") and int(lines[-1].split()[-1]) >= 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHM_COMM = """
import importlib, os
import deepspeed
from video_grpo.runtime.deepspeed_imports import SHM_ENV, skip_cpu_shm_comm_build
module = importlib.import_module("deepspeed.comm.torch")
own = module.build_shm_op
assert own.__module__ == "deepspeed.comm.torch" and own.__qualname__ == "build_shm_op"
from deepspeed.accelerator import get_accelerator
# DeepSpeed's own build_shm_op would build it here (else shm_comm_op is None with or without the hook)
assert get_accelerator().create_op_builder("ShareMemCommBuilder").is_compatible()
os.environ[SHM_ENV] = "1"
assert skip_cpu_shm_comm_build() is False and module.build_shm_op is own  # switched off: DeepSpeed's own
del os.environ[SHM_ENV]
assert skip_cpu_shm_comm_build() is True and module.build_shm_op is not own
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)  # constructs TorchBackend
comm = importlib.import_module("deepspeed.comm.comm")  # its global cdb: what init_distributed made
print("backend:", type(comm.cdb).__name__, comm.get_world_size(), comm.cdb.shm_comm_op)
comm.destroy_process_group()
"""


def test_cpu_shm_comm_op_not_built(tmp_path):
    """On the CPU accelerator, with an empty extensions folder: after the hook, DeepSpeed's ``init_distributed``
    (a one-process gloo group) constructs its ``TorchBackend`` without ``shm_comm_op`` and builds nothing (this
    process without the hook built ``deepspeed_shm_comm`` there: 102 CPU s, ``shm_comm_op`` the built module).
    Switched off, the hook leaves DeepSpeed's own ``build_shm_op`` (not called here: that is the build)."""
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    env = {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(extensions), "MASTER_ADDR": "127.0.0.1"}
    env |= {"MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    lines = run_fresh(SHM_COMM, {**env, "VIDEO_GRPO_CPU_SHM_COMM": "0"})
    assert lines[-1] == "backend: TorchBackend 1 None"
    assert list(extensions.iterdir()) == []  # no deepspeed_shm_comm folder, nothing else either


def test_deepspeed_requested(tmp_path, monkeypatch):
    """What the entry points read before parsing: the launch's environment, a flag, the recipe's field (the recipe
    read as TrlParser reads it: the first ``--config``)."""
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    plain, with_field = tmp_path / "plain.yaml", tmp_path / "ds.yaml"
    plain.write_text("learning_rate: 1.0e-6\n")
    with_field.write_text("deepspeed: configs/ds.json\n")
    for args, wanted in (
        (["--config", str(plain), "--output_dir", "x"], False),
        (["--config", str(with_field)], True),
        (["--config", str(plain), "--config", str(with_field)], False),  # TrlParser reads the first
        (["--config", str(plain), "--deepspeed", "ds.json"], True),
        (["--deepspeed=ds.json"], True),
        (["--output_dir", "x"], False),
    ):
        assert deepspeed_requested(args, recipe_of(args)) is wanted, args
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert deepspeed_requested(["--config", str(plain)], recipe_of(["--config", str(plain)]))


def test_the_recipes_env_block_is_set_before_the_hook(tmp_path, monkeypatch):
    """A recipe's ``env:`` reaches the hook (here its switch), as TrlParser would set it before the config is
    built; without DeepSpeed nothing is imported for it."""
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    monkeypatch.delenv(deepspeed_imports.SHM_ENV, raising=False)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"deepspeed: ds.json\nenv:\n  {deepspeed_imports.SHM_ENV}: 1\n")
    assert before_parsing(["--config", str(recipe)]) is False  # switched off by the recipe
    assert os.environ[deepspeed_imports.SHM_ENV] == "1"
    monkeypatch.delenv(deepspeed_imports.SHM_ENV)
    skipped: list[bool] = []
    monkeypatch.setattr(deepspeed_imports, "skip_cpu_shm_comm_build", lambda: skipped.append(True) or True)
    recipe.write_text("learning_rate: 1.0e-6\n")
    assert before_parsing(["--config", str(recipe)]) is False and skipped == []  # not a DeepSpeed run
    recipe.write_text("deepspeed: ds.json\n")
    assert before_parsing(["--config", str(recipe)]) is True and skipped == [True]


@pytest.mark.parametrize("entry_name", ["video_grpo.grpo", "video_grpo.sft"])
def test_entry_points_skip_it_before_parsing(entry_name, monkeypatch):
    """``grpo`` and ``sft`` call the hook before their training arguments are built (whose ``__post_init__``
    makes the distributed state), and only for a DeepSpeed run: a plain run imports no DeepSpeed for it."""
    import importlib

    entry = importlib.import_module(entry_name)
    calls: list[str] = []

    class RecordingParser:
        def __init__(self, dataclasses):
            pass

        def parse_args_and_config(self, args):
            calls.append("parse")
            return args

    monkeypatch.setattr(entry, "TrlParser", RecordingParser)
    monkeypatch.setattr(deepspeed_imports, "skip_cpu_shm_comm_build", lambda: calls.append("skip") or True)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    entry.parse_args(["--output_dir", "x"])
    assert calls == ["parse"]
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    calls.clear()
    entry.parse_args(["--output_dir", "x"])
    assert calls == ["skip", "parse"]
