"""What the planner measures of a model, kept by everything it depends on: in this process and on disk.

Most of a plan's time is spent on what depends only on the model and the step's widths: the meta model that gives
the exact parameter counts (:func:`video_grpo.plan.model.read_model_shape`), the linear layers' sizes
(:func:`video_grpo.plan.compute.linear_sizes`), and each layer traced on fake tensors at the real sizes
(:mod:`video_grpo.plan.layers`), with the imports of torch's fake tensors and the model's transformers code they
need. Those results are kept here, per model, keyed by:

- the model's config, as transformers reads it (every field, defaults included, and its attention backend);
- the planner's own source (every file of ``video_grpo/plan/`` and the modules it asks about the model:
  ``inputs/families.py``, ``inputs/prefix.py``), so an edit to how a layer is traced never reads an old trace;
- the versions of Python, torch, transformers and peft, whose code is what is traced;

and, within a model's entry, by the function and its arguments (the widths, dtype, LoRA rank...). So a stale
entry cannot be read: any change to what a result depends on is a different key. In this process the entries are
shared by every recipe of the same model (planning every shipped recipe builds each model once); on disk they
make a fresh process's plan skip the traces entirely.

The disk cache is under ``$XDG_CACHE_HOME/video_grpo/plan`` (``~/.cache/...``), or the folder named by the
environment variable :data:`ENV`; ``VIDEO_GRPO_PLAN_CACHE=off`` switches it off (the in-process one stays: it is
what one process computed itself). The recipe defaults of TRL's dataclasses are kept the same way, keyed by the TRL
and transformers versions (:func:`trl_defaults`), so a warm plan imports neither torch's tracing nor TRL.

Under the disk cache lies a read-only one shipped in the package (:data:`SHIPPED`): the entries of the shipped GPU
recipes' models (their configs in ``configs/models/``) and TRL's defaults, traced by
``python -m video_grpo.plan --shipped_cache`` (:mod:`video_grpo.plan.shipped`). They are files of the same keys, so a
fresh clone with the pinned versions plans a shipped recipe without tracing anything, and any other model, version or
planner source is a different key: a miss, traced as before. A key's entries are the shipped file's with the disk
file's over them; ``off`` switches both off (everything traced afresh), and entries are written to the disk folder
only, never into the package.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import platform
import tempfile
import weakref
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

ENV = "VIDEO_GRPO_PLAN_CACHE"  # a folder for the disk cache, or "off"
OFF = ("off", "0", "false", "no", "none")
PACKAGE = Path(__file__).resolve().parents[1]  # src/video_grpo
SHIPPED = PACKAGE / "plan" / "shipped"  # the read-only entries shipped in the package: {key}.json
# The planner's own code and the modules whose answers about a model it keeps (families: detect_family; prefix:
# unforkable_layers; live_memory: what a trace counts). Every .py file of the plan package is included, this one too.
SOURCES = ("inputs/families.py", "inputs/prefix.py", "runtime/live_memory.py")
VERSIONED = ("torch", "transformers", "peft")

_memory: dict[str, dict[str, Any]] = {}  # key -> entries, this process's (loaded from disk on first use)
_shape_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ModelShape -> its model's key
_stats = {"hits": 0, "misses": 0}


def folder() -> Path | None:
    """The disk cache's folder, or None when :data:`ENV` switches it off."""
    value = os.environ.get(ENV)
    if value is not None and value.strip().lower() in OFF:
        return None
    if value:
        return Path(value)
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "video_grpo" / "plan"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


_fingerprint: str | None = None


def fingerprint() -> str:
    """The planner's source and the versions of the code it traces, hashed (once per process)."""
    global _fingerprint
    if _fingerprint is None:
        digest = hashlib.sha256()
        files = sorted((PACKAGE / "plan").glob("*.py")) + [PACKAGE / name for name in SOURCES]
        for path in files:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        digest.update(_python().encode())
        for name in VERSIONED:
            digest.update(f"{name}={_version(name)}\0".encode())
        _fingerprint = digest.hexdigest()
    return _fingerprint


def _python() -> str:
    """The Python implementation and version, not ``sys.version``: the build's date and compiler change no trace,
    and a fresh clone's Python of the same version then reads the shipped entries."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def model_key(config) -> str:
    """The key of a transformers model config: every field as transformers writes it, its attention backend, and
    :func:`fingerprint`."""
    text = config.to_json_string(use_diff=False)
    attention = repr(getattr(config, "_attn_implementation", None))
    return hashlib.sha256(f"{fingerprint()}\0{attention}\0{text}".encode()).hexdigest()[:32]


def file_key(content: bytes, pretrained: bool) -> str:
    """The key of a model whose config transformers reads from a ``config.json`` of this ``content``, with
    ``from_pretrained`` or (not ``pretrained``) ``for_model`` on its values
    (:class:`video_grpo.plan.model.ConfigFile`): what transformers makes of them is fixed by its version, which
    :func:`fingerprint` covers."""
    how = b"from_pretrained" if pretrained else b"for_model"
    return hashlib.sha256(fingerprint().encode() + b"\0file\0" + how + b"\0" + content).hexdigest()[:32]


def has(key: str, name: str) -> bool:
    """Whether (``key``, ``name``) is kept, in this process or on disk."""
    return name in _entries(key)


def remember_shape(shape, key: str) -> None:
    _shape_keys[shape] = key


def shape_key(shape) -> str:
    """The key of the model a :class:`~video_grpo.plan.model.ModelShape` was read from."""
    key = _shape_keys.get(shape)
    if key is None:
        key = model_key(shape.config)
        _shape_keys[shape] = key
    return key


def _path(key: str) -> Path | None:
    root = folder()
    return None if root is None else root / f"{key}.json"


def _read(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, or half-written by a process that died: a miss
        return {}


def _entries(key: str) -> dict[str, Any]:
    """The key's entries: this process's, else the shipped file's with the disk file's over them (none when off)."""
    if key not in _memory:
        path = _path(key)
        _memory[key] = {} if path is None else {**_read(SHIPPED / f"{key}.json"), **_read(path)}
    return _memory[key]


def shipped() -> dict[str, dict[str, Any]]:
    """Every shipped file's entries, by key (what :data:`SHIPPED` holds, whatever the versions here)."""
    return {path.stem: _read(path) for path in sorted(SHIPPED.glob("*.json"))}


def kept(keys: set[str]) -> dict[str, dict[str, Any]]:
    """This process's entries of these keys (those it has), by key: what it traced or read."""
    return {key: dict(_memory[key]) for key in sorted(keys) if _memory.get(key)}


def write_shipped(entries: dict[str, dict[str, Any]]) -> list[str]:
    """Replace the shipped files with these keys' entries (one entry a line, by name, so a diff shows what moved;
    each value as it was made: its dicts keep their order). Returns the names of the files removed (stale)."""
    SHIPPED.mkdir(exist_ok=True)
    for key, values in entries.items():
        lines = [f"{json.dumps(name)}: {json.dumps(values[name])}" for name in sorted(values)]
        (SHIPPED / f"{key}.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    stale = [path for path in SHIPPED.glob("*.json") if path.stem not in entries]
    for path in stale:
        path.unlink()
    return sorted(path.name for path in stale)


def _write(key: str, name: str, value: Any) -> None:
    """Add one entry to the key's file: read, merged, written to a temporary file and renamed (a reader never sees
    half a file; two processes writing at once lose at most an entry, which is then a miss)."""
    path = _path(key)
    if path is None:
        return
    with contextlib.suppress(OSError):  # a read-only or full disk: the plan is made all the same
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read(path)
        entries[name] = value
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w") as f:
                json.dump(entries, f)
            os.replace(temporary, path)
        finally:  # a failed dump or rename leaves no temporary file behind
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def cached(key: str, name: str, compute: Callable[[], Any]) -> Any:
    """The JSON value ``compute()`` gives, kept under (``key``, ``name``): computed once per key and name, in this
    process or, with the disk cache on, on this machine."""
    entries = _entries(key)
    if name in entries:
        _stats["hits"] += 1
        return entries[name]
    _stats["misses"] += 1
    value = json.loads(json.dumps(compute()))  # what a later read gives: tuples as lists
    entries[name] = value
    _write(key, name, value)
    return value


def entry_name(function: str, *args: Any) -> str:
    """A function's entry name: its name and its arguments (numbers, strings, tuples), as JSON."""
    return function + json.dumps(args, separators=(",", ":"))


def clear_memory() -> None:
    """Forget this process's entries (the disk's stay): what a test does to plan as a fresh process would."""
    _memory.clear()
    _shape_keys.clear()


def stats() -> dict[str, int]:
    """Hits and misses so far in this process (the benchmark reports them)."""
    return dict(_stats)


def trl_defaults() -> dict[str, Any]:
    """The defaults of TRL's ``GRPOConfig`` and ``ModelConfig`` fields (what a recipe leaves out), by name.

    Importing TRL imports transformers' training code (seconds); the defaults depend only on the TRL and
    transformers versions, so they are kept on disk under those. Every default is None, a bool, a number, a string
    or a list of them, so JSON gives them back as they were."""
    return copy.deepcopy(cached(trl_defaults_key(), "defaults", _read_trl_defaults))  # the caller may edit it


def trl_defaults_key() -> str:
    """The key of :func:`trl_defaults`: the TRL, transformers and Python versions."""
    versions = f"trl={_version('trl')}\0transformers={_version('transformers')}\0{_python()}"
    return "trl-defaults-" + hashlib.sha256(versions.encode()).hexdigest()[:32]


def _read_trl_defaults() -> dict[str, Any]:
    from trl import GRPOConfig, ModelConfig

    return dataclass_defaults(GRPOConfig, ModelConfig)


def dataclass_defaults(*classes: type) -> dict[str, Any]:
    """Each field's default (or its default factory's value), by name; a later class's field wins."""
    import dataclasses

    values: dict[str, Any] = {}
    for cls in classes:
        for spec in dataclasses.fields(cls):
            if spec.default is not dataclasses.MISSING:
                values[spec.name] = spec.default
            elif spec.default_factory is not dataclasses.MISSING:
                values[spec.name] = spec.default_factory()
    return values
