"""Run model code at full width with no weights in memory: fake tensors for what is large, real ones for indices.

A fake tensor (``torch._subclasses.fake_tensor``) has a shape, dtype and device but no data, so a 7B model's layer
runs in milliseconds and allocates nothing. Data-dependent steps (window indices, rotary positions, packing,
``tolist()``) need values, though; :class:`HalfFake` runs an operator for real when all its inputs are real and
its outputs are small, and fake otherwise. Counting the storages operators return
(:class:`video_grpo.runtime.live_memory.LiveBytes`) then gives the bytes a real run of the same code would hold.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

SMALL_BYTES = 1 << 30  # an operator on real inputs whose outputs stay below this runs for real


aten = torch.ops.aten
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _real_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and not isinstance(index, FakeTensor) and index.dtype == torch.bool


def _positions(indices) -> list:
    """Indices with each real boolean mask replaced by the integer positions it selects (one index per dimension
    it covers), so a fake tensor indexed by it has a known shape."""
    out = []
    for index in indices:
        out.extend(index.nonzero().unbind(1) if _real_mask(index) else [index])
    return out


class OnceAskedFakeMode(FakeTensorMode):
    """A FakeTensorMode that asks whether a GPU could be initialised once, when it is made, not at every entry.

    HalfFake enters its fake mode once or twice per operator, and each entry asks ``torch.cuda.is_available()``.
    Once DeepSpeed is imported (it sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1``), that question tries to load NVML
    each time: on this CPU machine about 0.18 ms of CPU per entry (0.03 without it), the same answer every time.
    The answer is what the mode would have computed at its first entry. The planner's traces and the measured
    step (:mod:`video_grpo.bench.plan_measure`) both run in it: plans byte-identical, 51 -> 37 CPU s for the in-process
    plan test's recipes with DeepSpeed imported (6 December)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._avoid_device_init = FakeTensorMode.avoid_device_init.fget(self)

    @property
    def avoid_device_init(self) -> bool:  # type: ignore[override]
        return self._avoid_device_init


class HalfFake(TorchDispatchMode):
    """Operators with a fake input, or with outputs above :data:`SMALL_BYTES`, run fake; the rest run for real.

    Why: index arithmetic (window indices, rotary positions, ``tolist()``) needs values, while activations and
    weights need only their shapes. Outputs of real operators that would be large (a (L, L) mask from real
    segment ids, say) are made fake instead, so nothing large is ever allocated."""

    def __init__(self) -> None:
        super().__init__()
        self.fake = OnceAskedFakeMode(allow_non_fake_inputs=True)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(x, FakeTensor) for x in tree_leaves((args, kwargs))):
            if func in INDEXING and any(_real_mask(i) for i in args[1]):
                args = (
                    args[0],
                    _positions(args[1]),
                    *args[2:],
                )  # a real boolean mask: its positions, for real
            with self.fake:
                result = func(*args, **kwargs)
            out = kwargs.get("out")
            if isinstance(out, torch.Tensor) and isinstance(result, torch.Tensor):
                # a kernel writes into ``out`` even when it is a strided view (TRL's head projects into a slice of
                # one buffer); fake tensors would give it new storage instead, which a real run never allocates
                return out
            return result
        returns = func._schema.returns
        if returns and all(r.alias_info is not None for r in returns):
            return func(*args, **kwargs)  # a view or an in-place update of a real tensor allocates nothing
        try:
            with self.fake:
                probe = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException, NotImplementedError, RuntimeError):
            return func(*args, **kwargs)  # data-dependent: only its real run knows the output's size
        size = sum(t.untyped_storage().nbytes() for t in tree_leaves(probe) if isinstance(t, torch.Tensor))
        return probe if size > SMALL_BYTES else func(*args, **kwargs)

    def empty(self, shape, dtype, requires_grad=False) -> torch.Tensor:
        """A fake tensor (on the CPU) of this shape."""
        with self.fake:
            return torch.empty(shape, dtype=dtype, requires_grad=requires_grad)


def fake_parameters(model: torch.nn.Module, mode: HalfFake) -> None:
    """Replace every parameter and buffer of a model built on the meta device by a fake CPU tensor of the same
    shape and dtype; tied parameters stay tied."""
    made: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is None:
                continue
            if id(parameter) not in made:
                made[id(parameter)] = torch.nn.Parameter(
                    mode.empty(parameter.shape, parameter.dtype), requires_grad=parameter.requires_grad
                )
            module._parameters[name] = made[id(parameter)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = mode.empty(buffer.shape, buffer.dtype)
