"""What a long run could accumulate, measured as sizes at one step: the soak compares them at an early and the last
step (:mod:`video_grpo.bench.soak`).

Each entry is something that has grown in some run of some trainer: per-step metric lists, the log history, hooks
on the model's modules, the compiled decoder's per-call keys and cache views, dynamo's counters and compile
records, Python objects by type, and tensor storages reachable from Python. A size that stays put over hundreds of
steps is a container that is emptied or bounded; one that grows is a leak or a log, and the row says which."""

from __future__ import annotations

import gc
import os
from collections import Counter

import torch

from video_grpo.runtime.checkpointing import input_grad_hooks

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (cheap enough to read every step)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def tensor_bytes() -> int:
    """Bytes of the distinct CPU storages of every tensor Python can reach: the project's "live tensor bytes"
    (``video_grpo.runtime.live_memory``) as a snapshot, since its dispatch mode cannot watch a compiled step. Views
    share a storage and count once; fake tensors (dynamo's traced examples) hold no memory and are skipped."""
    from torch._subclasses.fake_tensor import FakeTensor

    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: it reads ``__class__``, which deprecated module proxies warn on
        if issubclass(kind, torch.Tensor) and not issubclass(kind, FakeTensor) and obj.device.type == "cpu":
            try:
                storage = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse or otherwise storage-less tensors
                continue
            storages[storage._cdata] = storage.nbytes()
    return sum(storages.values())


def object_types() -> Counter:
    """How many Python objects the collector tracks, by type: what grows when nothing named above does."""
    return Counter(f"{type(obj).__module__}.{type(obj).__qualname__}" for obj in gc.get_objects())


def _hook_count(model: torch.nn.Module) -> int:
    tables = (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_state_dict_hooks",
        "_load_state_dict_pre_hooks",
    )
    return sum(len(getattr(module, table, {})) for module in model.modules() for table in tables)


def _dynamo_sizes() -> dict[str, int]:
    from torch._dynamo import utils as dynamo_utils

    return {
        "dynamo counters (distinct keys)": sum(len(counter) for counter in dynamo_utils.counters.values()),
        "dynamo compile-time records": sum(
            len(times) for times in dynamo_utils.compilation_time_metrics.values()
        ),
        "dynamo guard-failure records": sum(len(fails) for fails in dynamo_utils.guard_failures.values()),
    }


def container_sizes(trainer) -> dict[str, int]:
    """Sizes of the named containers of a ``VideoGRPOTrainer`` run (and of the process's dynamo state)."""
    model = trainer.model
    metrics = trainer._metrics["train"]
    sizes = {
        "trainer._metrics[train] values": sum(len(values) for values in metrics.values()),
        "trainer._metrics[train] keys": len(metrics),
        "trainer._metrics[eval] values": sum(len(values) for values in trainer._metrics["eval"].values()),
        "trainer._pending_metrics values": sum(
            len(v) for v in getattr(trainer, "_pending_metrics", {}).values()
        ),
        "trainer.state.log_history entries": len(trainer.state.log_history),
        "trainer._logs completions": len(trainer._logs["completion"]),
        "trainer._warned_bad_videos": len(trainer._warned_bad_videos),
        # accelerate keeps every data loader it prepared; transformers prepares a new one at each evaluation
        "trainer.accelerator._dataloaders": len(trainer.accelerator._dataloaders),
        "hooks on the policy's modules": _hook_count(model),
        "input-embedding gradient hooks": sum(input_grad_hooks(model)),
        "python objects tracked by gc": len(gc.get_objects()),
    }
    if trainer.ref_model is not None:
        sizes["hooks on the reference's modules"] = _hook_count(trainer.ref_model)
    if trainer.video_encoder is not None:
        sizes["video encoder cache entries"] = len(trainer.video_encoder.cache)
    decoder = trainer.decoder
    if decoder is not None:
        sizes["decoder.stats.graph_keys"] = len(decoder.stats.graph_keys)
        sizes["decoder cache views"] = len(decoder._views)
    return {**sizes, **_dynamo_sizes()}
