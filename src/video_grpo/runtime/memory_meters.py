"""The readers the plan check (:mod:`video_grpo.runtime.memory_check`) measures a phase with.

A reader's ``adopt(tensors)`` counts tensors made before it opened; its ``begin()`` starts a phase and returns the bytes alive at that moment; ``end()`` returns the most bytes
alive at once since ``begin()``. Both count live tensors, the quantity the plan estimates:

- :class:`CudaPeaks`: the CUDA allocator's ``memory_allocated`` and ``max_memory_allocated`` (the peak reset at each
  ``begin``). It costs nothing; what the allocator reserves besides is the plan's headroom.
- :class:`LivePeaks`: live tensor bytes by storage (:class:`video_grpo.runtime.live_memory.LiveBytes`), with the
  tensors a step starts with adopted (:func:`alive_tensors`). It sees every operator, so it slows the step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class CudaPeaks:
    """Phase peaks from the CUDA allocator."""

    name = "torch.cuda.max_memory_allocated"

    def open(self, trainer) -> None:
        pass

    def adopt(self, tensors) -> None:
        pass  # the allocator counts every CUDA tensor already

    def begin(self) -> int:
        torch.cuda.reset_peak_memory_stats()
        return int(torch.cuda.memory_allocated())

    def end(self) -> int:
        return int(torch.cuda.max_memory_allocated())

    def close(self) -> None:
        pass


class LivePeaks:
    """Phase peaks in live tensor bytes, counting what was alive when the measured step began."""

    name = "live tensor bytes (video_grpo.runtime.live_memory.LiveBytes)"

    def __init__(self) -> None:
        self.live = None

    def open(self, trainer) -> None:
        from video_grpo.runtime.live_memory import LiveBytes

        self.live = LiveBytes()
        self.live.__enter__()
        self.live.adopt(alive_tensors(trainer))

    def adopt(self, tensors) -> None:
        """Count ``tensors`` too from now on (a batch made before the step, as its decoded videos are)."""
        self.live.adopt(tensors)

    def begin(self) -> int:
        self.live.reset_peak()
        return self.live.current

    def end(self) -> int:
        return self.live.peak

    def close(self) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None


def alive_tensors(trainer) -> Iterator[torch.Tensor]:
    """What a step starts with: the policy's and the reference's weights and buffers (under ZeRO-3 each rank's
    partition, ``ds_tensor``), gradients, every optimizer's parameters and states down the wrapper chain (accelerate's
    wrapper, DeepSpeed's ZeRO optimizer whose parameters are the float32 master partitions, the torch optimizer),
    and the generation batch still buffered from before. A storage adopted twice is counted once."""
    for model in (trainer.model, getattr(trainer, "ref_model", None)):
        if model is not None:
            for parameter in model.parameters():
                yield parameter
                if isinstance(getattr(parameter, "ds_tensor", None), torch.Tensor):
                    yield parameter.ds_tensor
                if parameter.grad is not None:
                    yield parameter.grad
            yield from model.buffers()
    yield from optimizer_tensors(getattr(trainer, "optimizer", None))
    yield from tensors_in(getattr(trainer, "_buffered_inputs", None))


def optimizer_tensors(optimizer) -> Iterator[torch.Tensor]:
    seen: set[int] = set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        for group in getattr(optimizer, "param_groups", None) or ():
            yield from tensors_in(group.get("params"))
        state = getattr(optimizer, "state", None)
        if isinstance(state, dict):
            yield from tensors_in(list(state.values()))
        # a ZeRO optimizer's own buffers made before the step: ZeRO-3's reduce bucket (built with the optimizer,
        # kept for the run) and its flat gradient partitions (video_grpo.plan.deepspeed_buffers)
        for bucket in (getattr(optimizer, "ipg_buckets", None) or {}).values():
            yield from tensors_in(getattr(bucket, "buffer", None))
        yield from tensors_in(getattr(optimizer, "grad_partitions_flat_buffer", None))
        optimizer = getattr(optimizer, "optimizer", None)


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
