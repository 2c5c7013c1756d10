"""The plan check: a run measures its own step, phase by phase, beside the planner's estimate of it.

After the first optimizer step (the first after which the optimizer's states exist, as the plan assumes of every
step), the next step is measured until it has shown each phase: generation, the old-policy and reference
forwards, the loss forward and backward, the optimizer step. Each phase's peak is measured from its start:

- on CUDA, ``torch.cuda.max_memory_allocated`` with the peak reset at each phase boundary: the allocator's
  count of live tensors, the quantity the plan estimates (what it reserves besides is the plan's headroom);
- on the CPU, live tensor bytes (:class:`video_grpo.plan.live_memory.LiveBytes`), counting the weights, the
  optimizer's states and the buffered batch alive at the step's start. It sees every operator, so it slows the
  measured step: ``plan_check: true`` turns it on; off by default on the CPU.

The ratios (planned / measured) are logged and written to ``output_dir/plan_check.json``; when one is outside
:data:`TOLERANCE` the log says so and asks for the JSON to be reported. The phases are bounded by the trainer's
methods: ``_generate_single_turn`` (generation), the rest of ``_generate_and_score_completions`` (old policy and
reference), ``compute_loss`` to the end of ``training_step`` (loss), and the callbacks around the optimizer step.
Under DeepSpeed the optimizer steps inside the last backward, so its peak is measured in the loss phase.
Only rank 0 measures: a check makes no collective call, so no rank waits for it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

PHASES = ("generation", "old_and_reference", "loss", "optimizer")
NEEDED = ("generation", "loss", "optimizer")  # old_and_reference is measured whenever generation is
TOLERANCE = 0.15
GB = 1e9


def wanted(plan_check: bool | None, on_cuda: bool) -> bool:
    """``plan_check`` resolved: None means on with CUDA (free) and off on the CPU (it slows the step)."""
    return on_cuda if plan_check is None else bool(plan_check)


class CudaPeaks:
    """Phase peaks from the CUDA allocator."""

    name = "torch.cuda.max_memory_allocated"

    def open(self, trainer) -> None:
        pass

    def begin(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def end(self) -> int:
        return int(torch.cuda.max_memory_allocated())

    def close(self) -> None:
        pass


class LivePeaks:
    """Phase peaks in live tensor bytes, counting what was alive when the measured step began."""

    name = "live tensor bytes (video_grpo.plan.live_memory.LiveBytes)"

    def __init__(self) -> None:
        self.live = None

    def open(self, trainer) -> None:
        from video_grpo.plan.live_memory import LiveBytes

        self.live = LiveBytes()
        self.live.__enter__()
        self.live.adopt(alive_tensors(trainer))

    def begin(self) -> None:
        self.live.reset_peak()

    def end(self) -> int:
        return self.live.peak

    def close(self) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None


def alive_tensors(trainer) -> Iterator[torch.Tensor]:
    """What a step starts with: the policy's and the reference's weights and buffers, gradients, the optimizer's
    states, and the generation batch still buffered from before."""
    for model in (trainer.model, getattr(trainer, "ref_model", None)):
        if model is not None:
            yield from model.parameters()
            yield from model.buffers()
            yield from (p.grad for p in model.parameters() if p.grad is not None)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    if optimizer is not None:
        for state in optimizer.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))
    yield from tensors_in(getattr(trainer, "_buffered_inputs", None))


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


class PlanCheck(TrainerCallback):
    """Measures one step after the first optimizer step and compares each phase with ``planned`` (bytes by phase,
    :attr:`video_grpo.plan.recipe.Plan.memory`). :meth:`install` wraps the trainer's phase boundaries."""

    def __init__(self, trainer, plan, output_dir: str, meter=None) -> None:
        self.trainer, self.plan, self.output_dir = trainer, plan, output_dir
        self.meter = meter or (
            CudaPeaks() if torch.cuda.is_available() and not trainer.args.use_cpu else LivePeaks()
        )
        self.armed = self.active = self.done = False
        self.current: str | None = None
        self.measured: dict[str, int] = {}
        self.step: int | None = None
        self.longest = {"prompt": 0, "answer": 0}  # tokens seen in the measured window, beside the plan's
        self.deepspeed = bool(getattr(trainer, "is_deepspeed_enabled", False))

    # -- installing -----------------------------------------------------------------------------------------

    def install(self) -> PlanCheck:
        trainer = self.trainer
        generate = trainer._generate_single_turn
        score = trainer._generate_and_score_completions
        compute_loss = trainer.compute_loss
        training_step = trainer.training_step

        def generate_phase(prompt_ids, *args, **kwargs):
            self.begin("generation")
            out = generate(prompt_ids, *args, **kwargs)
            if self.current == "generation":
                self.longest["prompt"] = max([self.longest["prompt"], *map(len, prompt_ids)])
                self.longest["answer"] = max([self.longest["answer"], *map(len, out[0])])
            self.end("generation")
            self.begin("old_and_reference")  # until the scored batch is returned
            return out

        def score_phase(*args, **kwargs):
            out = score(*args, **kwargs)
            self.end("old_and_reference")
            return out

        def loss_phase(*args, **kwargs):
            if self.current != "loss":
                self.begin("loss")
            return compute_loss(*args, **kwargs)

        def step_phase(*args, **kwargs):
            out = training_step(*args, **kwargs)  # the backward is its last work
            self.end("loss")
            return out

        trainer._generate_single_turn = generate_phase
        trainer._generate_and_score_completions = score_phase
        trainer.compute_loss = loss_phase
        trainer.training_step = step_phase
        trainer.add_callback(self)
        return self

    # -- phases ---------------------------------------------------------------------------------------------

    def begin(self, phase: str) -> None:
        if self.active and self.trainer.model.training:
            self.current = phase
            self.meter.begin()

    def end(self, phase: str) -> None:
        if self.active and self.current == phase:
            self.measured[phase] = max(self.measured.get(phase, 0), self.meter.end())
            self.current = None

    # -- the step measured ----------------------------------------------------------------------------------

    def on_step_begin(self, args, state, control, **kwargs):
        if self.armed and not self.active and not self.done:
            self.active, self.step = True, state.global_step + 1
            self.meter.open(self.trainer)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.begin("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.end("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        if not self.armed:
            self.armed = True  # the first optimizer step is done: its states exist from now on
            return
        if self.active and all(phase in self.measured for phase in NEEDED):
            self.finish()

    def on_train_end(self, args, state, control, **kwargs):
        if self.active and not self.done:
            self.meter.close()
            self.active = False
            logger.warning(
                "plan check: training ended before a whole step after the first optimizer step was measured "
                f"(phases seen: {sorted(self.measured) or 'none'}); nothing written. Run at least 2 steps."
            )

    def finish(self) -> None:
        self.meter.close()
        self.active, self.done = False, True
        record = self.record()
        os.makedirs(self.output_dir, exist_ok=True)
        with open(os.path.join(self.output_dir, "plan_check.json"), "w") as f:
            json.dump(record, f, indent=2)
        for phase, row in record["phases"].items():
            logger.warning(
                f"plan check: {phase}: planned {row['planned_gb']:.4g} GB, measured {row['measured_gb']:.4g} GB "
                f"(planned / measured {row['ratio']})"
            )
        peak = record["peak"]
        logger.warning(
            f"plan check: peak planned {peak['planned_gb']:.4g} GB ({peak['planned_phase']}), measured "
            f"{peak['measured_gb']:.4g} GB ({peak['measured_phase']}): ratio {peak['ratio']}"
        )
        tokens = record["tokens"]
        if tokens["prompt_seen"] > tokens["prompt_planned"]:
            logger.warning(
                f"plan check: the longest prompt had {tokens['prompt_seen']} tokens, the plan "
                f"{tokens['prompt_planned']} (the planner counts the prompt's text as Qwen's tokenizer does)"
            )
        if record["outside"]:
            logger.warning(
                f"plan check: the plan is off by more than {TOLERANCE:.0%} in {', '.join(record['outside'])}. Please "
                f"report it to the project's issue tracker with {os.path.join(self.output_dir, 'plan_check.json')} "
                "(it holds the plan, the measurement and the run's settings)."
            )

    def record(self) -> dict:
        memory = self.plan.memory
        planned = {phase: memory.phases[phase].peak for phase in PHASES}
        if self.deepspeed:  # the optimizer steps inside the last backward: its peak is the loss phase's
            planned["loss"] = max(planned["loss"], planned["optimizer"])
        phases = {}
        for phase in PHASES:
            if phase in self.measured and self.measured[phase]:
                phases[phase] = {
                    "planned_gb": round(planned[phase] / GB, 6),
                    "measured_gb": round(self.measured[phase] / GB, 6),
                    "ratio": round(planned[phase] / self.measured[phase], 4),
                }
        measured_phase = max(self.measured, key=self.measured.get)
        peak_ratio = round(memory.peak / self.measured[measured_phase], 4)
        outside = [p for p, row in phases.items() if abs(row["ratio"] - 1) > TOLERANCE]
        if abs(peak_ratio - 1) > TOLERANCE:
            outside.insert(0, "the peak")
        return {
            "device": self.meter.name,
            "rank": self.trainer.accelerator.process_index,
            "step": self.step,
            "deepspeed": self.deepspeed,
            "peak": {
                "planned_gb": round(memory.peak / GB, 6),
                "planned_phase": memory.peak_phase,
                "measured_gb": round(self.measured[measured_phase] / GB, 6),
                "measured_phase": measured_phase,
                "ratio": peak_ratio,
            },
            "phases": phases,
            "tolerance": TOLERANCE,
            "outside": outside,
            "tokens": {
                "prompt_planned": self.plan.work.prompt_tokens,
                "prompt_seen": self.longest["prompt"],
                "answer_planned": self.plan.work.completion_tokens,
                "answer_seen": self.longest["answer"],
            },
            "planned_bytes_by_category": {phase: dict(memory.phases[phase].by_category) for phase in PHASES},
            "plan": self.plan.as_json(),
        }


def install_plan_check(trainer, plan, output_dir: str) -> PlanCheck:
    """Measure the run's second step against ``plan`` (see the module's docstring)."""
    return PlanCheck(trainer, plan, output_dir).install()
