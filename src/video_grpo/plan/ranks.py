"""The one device every rank of a launch fits for (``auto_fit``): the smallest among the ranks' devices.

Each rank reads its own device (:func:`video_grpo.plan.startup.run_device`): a GPU's memory, or
``auto_fit_memory_gb``. Ranks on cards of different sizes would each fit for their own and could choose different
micro-batches; under DeepSpeed they would then make different collective calls and hang in the first one. So every
rank sends its device to every other (:func:`gather_devices`, one ``all_gather_object`` over the launch's process
group, which ``TrainingArguments`` set up when it was parsed: gloo on the CPU, NCCL on CUDA), and all of them fit
for the device with the least memory (the lowest rank among equals): a fit chosen for a larger card could run out
of memory on the smallest, and one chosen for the smallest fits every other card. Every rank then checks that all
chose the same settings (:func:`check_agreement`), so that a rank whose files differ (another model config on
another node) stops the run with the ranks' choices named instead of hanging.

Every rank makes both calls, whatever its device: an early return on one rank would leave the others waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def world() -> tuple[int, int]:
    """(this process's rank, the number of ranks) in the launch's process group; (0, 1) without one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def all_gather(value: Any) -> list[Any]:
    """``value`` from every rank, by rank (a collective: every rank must call it)."""
    import torch.distributed as dist

    _, size = world()
    if size == 1:
        return [value]
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, value)
    return gathered


@dataclass
class RankDevices:
    """Every rank's device (a :func:`run_device` dict, or None where a rank has none) and which one all fit for."""

    devices: list[dict | None]  # by rank
    rank: int = 0  # this process's

    @property
    def chosen(self) -> int | None:
        """The rank whose device has the least memory (the lowest among equals); None when a rank has no device."""
        if any(device is None for device in self.devices):
            return None
        return min(range(len(self.devices)), key=lambda r: (self.devices[r]["memory_gb"], r))

    @property
    def gpu(self) -> dict | None:
        """The device every rank fits for."""
        chosen = self.chosen
        return None if chosen is None else self.devices[chosen]

    def as_json(self) -> dict:
        return {
            "processes": len(self.devices),
            "rule": "every rank fits for the smallest device among the ranks",
            "fitted_for_rank": self.chosen,
            "memory_gb_by_rank": [
                None if device is None else round(device["memory_gb"], 3) for device in self.devices
            ],
        }

    def words(self) -> str:
        """How the device was chosen, for the log; empty for a single process."""
        chosen = self.chosen
        if len(self.devices) == 1 or chosen is None:
            return ""
        memories = ", ".join(f"{device['memory_gb']:g}" for device in self.devices)
        return (
            f"fitted for the smallest device among {len(self.devices)} ranks (rank {chosen}'s, "
            f"{self.devices[chosen]['memory_gb']:g} GB; by rank: {memories} GB), the same fit on every rank"
        )


def gather_devices(local: dict | None) -> RankDevices:
    """Every rank's device, gathered on every rank (a collective)."""
    rank, _ = world()
    return RankDevices(all_gather(local), rank)


def check_agreement(choice: Any, what: str) -> None:
    """Raise on every rank when the ranks' ``choice`` differ (a collective: every rank must call it)."""
    choices = all_gather(choice)
    if any(other != choices[0] for other in choices[1:]):
        by_rank = "; ".join(f"rank {r}: {c}" for r, c in enumerate(choices))
        raise RuntimeError(
            f"{what}: the ranks chose differently from the same device ({by_rank}); each rank plans from its own "
            "copy of the recipe, the model's config.json and tokenizer, so check that every node has the same "
            "files, or set auto_fit: false and set the fields by hand"
        )
