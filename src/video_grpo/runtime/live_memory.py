"""Live tensor bytes, counted by storage: what a block of code holds at its peak, not what the allocator reserved.

RSS and the allocator's counters include caching, fragmentation and the interpreter, and are noisy on a shared
machine. :class:`LiveBytes` is a ``TorchDispatchMode``: every tensor an operator returns inside the block is
looked up by its storage; a storage not seen before adds its ``nbytes``, and a ``weakref`` callback takes them
off when the storage is freed. Views and in-place results share a storage and are counted once. It works on
CPU, meta and fake tensors alike, so a full-size step can be traced with no memory behind it.

Only storages made inside the block are counted; what existed before it (weights, the batch) is not. So
``peak`` is what the block added at its worst moment.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as live: ...``; then ``live.peak`` (bytes) and ``live.current`` (still alive).

    ``device_type``: count only storages on this kind of device ("cpu", "meta", "cuda"), or all if None.
    ``predicate``: count only tensors for which it is true (decided on the first tensor seen of a storage)."""

    def __init__(
        self, device_type: str | None = None, predicate: Callable[[torch.Tensor], bool] | None = None
    ) -> None:
        super().__init__()
        self.device_type = device_type
        self.predicate = predicate
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}  # storage address -> bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # a view or in-place result shares an input's storage: nothing new was allocated, even when that storage
        # was made before the block
        inputs = {
            value.untyped_storage()._cdata
            for value in tree_leaves((args, kwargs))
            if isinstance(value, torch.Tensor)
        }
        for value in tree_leaves(out):
            if isinstance(value, torch.Tensor):
                self._track(value, inputs)
        return out

    def adopt(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors made before the block (weights, optimizer states, a buffered batch) as live from now on,
        until their storage is freed: the block's ``current`` and ``peak`` then hold them too."""
        for tensor in tensors:
            self._track(tensor, set())

    def _track(self, tensor: torch.Tensor, inputs: set[int]) -> None:
        if self.device_type is not None and tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._live or key in inputs or (self.predicate is not None and not self.predicate(tensor)):
            return
        size = storage.nbytes()
        self._live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def reset_peak(self) -> None:
        self.peak = self.current
