"""Shared fixtures: a tiny Qwen2.5-VL built once per session, and the committed sample videos."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on the machine's two cores: one intra-op thread each, not four threads on two
    # cores (the tests compare paths within one process, at one thread count). Launched runs already start their
    # ranks with OMP_NUM_THREADS=1.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
# The planner's disk cache (video_grpo.plan.cache) in the checkout, not the user's home: a fresh clone plans cold, as
# CI does, and the tests never read or write what the user's own planner calls kept.
os.environ.setdefault("VIDEO_GRPO_PLAN_CACHE", str(REPO / "outputs" / "plan-cache"))
# DeepSpeed's JIT ops (DeepSpeedCPUAdam in the offload test; not the CPU shm comm op, which
# runtime/deepspeed_imports.py skips) are built in a folder of this Python environment's own. Their build commands
# name the environment's paths, so two environments sharing torch's default folder (a fresh clone's .venv and the
# main checkout's) rebuild each other's ops whenever they alternate: cpu_adam alone costs 170-330 CPU seconds a
# build on this machine, paid inside whichever launched test loads it next. A set TORCH_EXTENSIONS_DIR is kept.
if "TORCH_EXTENSIONS_DIR" not in os.environ:
    _environment = hashlib.sha1(sys.prefix.encode()).hexdigest()[:12]
    os.environ["TORCH_EXTENSIONS_DIR"] = str(
        Path.home()
        / ".cache"
        / "torch_extensions"
        / f"py{sys.version_info[0]}{sys.version_info[1]}-{_environment}"
    )
SAMPLES = REPO / "data_samples"
REFERENCE = REPO.parent / "shared" / "reference"


OUR_MODULES = r"video_grpo(\.|$)"
# What the libraries say when we call a deprecated API or pass a deprecated argument: raised inside the library
# (so not caught by OUR_MODULES), each once caused by our code. TRL 1.16 itself still calls the deprecated
# checkpointing methods when checkpointing is on, so a run with it on can only hold the argument rule.
OUR_DEPRECATED_CALLS = (r"`gradient_checkpointing_enable` is deprecated",)
OUR_DEPRECATED_ARGUMENTS = (r"`gradient_checkpointing(_kwargs)?` is deprecated",)  # recipe keys


def our_warnings_are_errors(calls: bool = True) -> None:
    """Turn a warning our code causes into an error (docs/internals.md#tests): one raised in a video_grpo module,
    or one of the deprecations our calls (``calls``) or recipes used to trigger. Library warnings stay warnings."""
    import warnings

    warnings.filterwarnings("error", module=OUR_MODULES)
    for message in OUR_DEPRECATED_ARGUMENTS + (OUR_DEPRECATED_CALLS if calls else ()):
        warnings.filterwarnings("error", message=message, category=FutureWarning)


@pytest.fixture
def our_warnings_raise() -> None:
    """:func:`our_warnings_are_errors` for this test (pytest restores the filters after it)."""
    our_warnings_are_errors()


@pytest.fixture
def our_warnings_raise_but_trls_checkpointing() -> None:
    """:func:`our_warnings_are_errors` for a run with checkpointing on, where TRL calls the deprecated methods."""
    our_warnings_are_errors(calls=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from video_grpo.toys.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2_5_vl")


@pytest.fixture(scope="session")
def train_file() -> Path:
    return SAMPLES / "train.jsonl"


@pytest.fixture(scope="session")
def family_model(tmp_path_factory):
    """``family_model("qwen3_vl")``: a tiny model of that family, built once per session."""
    from video_grpo.toys.tiny import build_tiny_model

    built = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_model(
                tmp_path_factory.mktemp(family) / f"tiny-{family}", family=family
            )
        return built[family]

    return get


@pytest.fixture
def checkpointed_calls(monkeypatch) -> list[str]:
    """The segments gradient checkpointing ran in this test, one entry (the function's name) per
    ``torch.utils.checkpoint.checkpoint`` call: transformers binds its checkpointing function to the one it imported
    when a model turns checkpointing on, so both names are wrapped before the model loads."""
    import torch.utils.checkpoint
    import transformers.modeling_utils

    calls: list[str] = []
    original = torch.utils.checkpoint.checkpoint

    def counted(function, *args, **kwargs):
        calls.append(getattr(function, "__name__", type(function).__name__))
        return original(function, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counted)
    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", counted)
    return calls


@pytest.fixture(autouse=True)
def transformers_left_as_found():
    """Fail a test that leaves transformers' loading patches in place. ``from_pretrained`` swaps
    ``PreTrainedModel.tie_weights`` / ``init_weights`` for no-ops (and sets torch's default dtype) while it loads
    and puts back what it found; two loads at once in threads can leave the no-op, and every model built later in
    the process is then untied (it moved a plan by 2.4 GB once, see docs/planning.md)."""
    import sys

    import torch

    yield
    utils = sys.modules.get("transformers.modeling_utils")
    if utils is None:
        return
    model = utils.PreTrainedModel
    for name in ("tie_weights", "init_weights"):
        found = getattr(model, name).__qualname__
        assert found == f"PreTrainedModel.{name}", f"this test left PreTrainedModel.{name} patched ({found})"
    assert torch.get_default_dtype() == torch.float32, (
        f"this test left the default dtype {torch.get_default_dtype()}"
    )


# The longest tests, started first: `make test` runs the suite on two workers (pytest-xdist, --dist worksteal), and a
# long test that starts last leaves one core idle while it finishes (docs/internals.md#tests has the budget).
LONGEST_FIRST = (
    "tests/test_learning.py",
    "tests/test_bench.py::test_perf_quick",
    "tests/test_scale.py::test_zero3_offload_runs_on_cpu",
    "tests/test_plan.py",
    "tests/test_real_widths.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        return next(
            (i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
            len(LONGEST_FIRST),
        )

    items.sort(key=rank)  # stable: the rest keep their order
