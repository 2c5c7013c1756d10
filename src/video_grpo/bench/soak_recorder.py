"""The soak's per-step record (:mod:`video_grpo.bench.soak`): a ``TrainerCallback`` that times each optimizer
step (wall clock, and the process's CPU time), reads RSS after it, and every ``sample_every`` steps, outside the
timed span, counts live tensor bytes and the sizes of :mod:`video_grpo.bench.soak_sizes`."""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field

from tqdm import tqdm
from transformers import TrainerCallback

from video_grpo.bench.soak_sizes import container_sizes, object_types, rss_bytes, tensor_bytes
from video_grpo.runtime.checkpointing import input_grad_hooks


@dataclass
class SoakRecord:
    """What one case's run left behind; plain data, so it crosses a process boundary."""

    step_seconds: list[float] = field(default_factory=list)
    step_cpu_seconds: list[float] = field(default_factory=list)  # this process's CPU time per step
    rss: list[int] = field(default_factory=list)  # after each step
    tensor_steps: list[int] = field(default_factory=list)  # steps at which tensor bytes were counted
    tensor_bytes: list[int] = field(default_factory=list)
    hooks: list[int] = field(default_factory=list)  # input-embedding gradient hooks after each step
    load: list[float] = field(default_factory=list)  # the machine's 1-minute load average after each step
    early_sizes: dict[str, int] = field(default_factory=dict)
    last_sizes: dict[str, int] = field(default_factory=dict)
    early_types: dict[str, int] = field(default_factory=dict)
    last_types: dict[str, int] = field(default_factory=dict)


class SoakRecorder(TrainerCallback):
    """Fills a :class:`SoakRecord` while ``trainer.train()`` runs, and shows a progress bar over its steps.

    ``early_step``: the step whose sizes every later one is compared with (after the warm-up, so that first-use
    allocations and the first compile are not counted as growth)."""

    def __init__(self, trainer, steps: int, early_step: int, sample_every: int, label: str) -> None:
        self.trainer = trainer
        self.steps = steps
        self.early_step = early_step
        self.sample_every = sample_every
        self.record = SoakRecord()
        self.bar = tqdm(total=steps, desc=label, unit="step", dynamic_ncols=True)
        self._start = self._cpu_start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start, self._cpu_start = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self._start
        record, step = self.record, state.global_step
        record.step_seconds.append(seconds)
        record.step_cpu_seconds.append(time.process_time() - self._cpu_start)
        record.rss.append(rss_bytes())
        record.hooks.append(sum(input_grad_hooks(self.trainer.model)))
        record.load.append(os.getloadavg()[0])
        if step % self.sample_every == 0 or step in (self.early_step, self.steps):
            gc.collect()
            record.tensor_steps.append(step)
            record.tensor_bytes.append(tensor_bytes())
        if step in (self.early_step, self.steps):
            sizes, types = container_sizes(self.trainer), dict(object_types())
            if step == self.early_step:
                record.early_sizes, record.early_types = sizes, types
            if step == self.steps:
                record.last_sizes, record.last_types = sizes, types
        self.bar.set_postfix(s=f"{seconds:.2f}", rss_mb=f"{record.rss[-1] / 2**20:.0f}", refresh=False)
        self.bar.update(1)

    def on_train_end(self, args, state, control, **kwargs):
        self.bar.close()
