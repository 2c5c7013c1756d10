"""The plan check: a run measures its own step, phase by phase, beside the planner's estimate of it.

After the first optimizer step (the first after which the optimizer's states exist, as the plan assumes of every
step), the next step is measured until it has shown each phase: generation, the old-policy and reference
forwards, the loss forward and backward, the optimizer step. Each phase's peak is measured from its start, in live
tensor bytes (:mod:`video_grpo.runtime.memory_meters`): on CUDA the allocator's count, free; on the CPU a count by storage
that sees every operator and so slows the measured step (``plan_check: true`` turns it on; off by default there).

**Like with like.** The run's plan is its worst case: every video at the recipe's largest, the longest prompt text,
every answer at ``max_completion_length``. A real step's prompts are usually shorter, so a comparison with the
worst case would read high on most runs and flag them. The check records the sizes the measured step saw (its
longest prompt and answer, its largest video's patch grid, its rows) and plans the step again at those sizes
(:func:`video_grpo.plan.startup.plan_at_step`); the ratios (planned / measured), the flags and the log compare the measured step with that
plan. The worst-case plan's margin over the measured step is reported beside them, never flagged. The re-plan runs
on rank 0 alone, after the step, and makes no collective call (the planner traces layers on fake tensors,
:mod:`video_grpo.plan.layers`); if it fails, the check compares with the worst case and says so.

The ratios are logged and written to ``output_dir/plan_check.json``; when one is outside :data:`TOLERANCE` the log
says so and asks for the JSON to be reported. The phases are bounded by the trainer's
methods: ``_generate_single_turn`` (generation), the rest of ``_generate_and_score_completions`` (old policy and
reference), ``compute_loss`` to the end of ``training_step`` (loss), and the optimizer's step.

**The optimizer's step under DeepSpeed.** Accelerate's ``optimizer.step()`` is a no-op there (its
``DeepSpeedOptimizerWrapper.step`` does nothing): the engine steps inside ``accelerator.backward`` at the
accumulation boundary (``DeepSpeedEngineWrapper.backward`` calls ``engine.step()``, which calls
``engine._take_model_step`` at the boundary, for every ZeRO stage). So under DeepSpeed the optimizer phase is the
engine's ``_take_model_step``, measured as a window inside the loss phase (which is measured around it); if the
engine has no such method the optimizer row is left out, with the reason in the log and the record, rather than
measured around the no-op.

The check never stops a run: a memory reader that fails (the CUDA reader has never run in this project's tests)
ends the check with a warning, and training goes on. Only rank 0 measures: a check makes no collective call, so no
rank waits for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from video_grpo.runtime.memory_meters import CudaPeaks, LivePeaks, tensors_in

logger = logging.getLogger(__name__)

PHASES = ("generation", "old_and_reference", "loss", "optimizer")
NEEDED = ("generation", "loss", "optimizer")  # old_and_reference is measured whenever generation is
TOLERANCE = 0.15
GB = 1e9
ENGINE_STEP = "_take_model_step"  # DeepSpeedEngine's optimizer step, called by engine.step() at the boundary
OPTIMIZER_WINDOW = {
    False: "the optimizer's step, between the Trainer's on_pre_optimizer_step and on_optimizer_step callbacks",
    True: (
        f"DeepSpeedEngine.{ENGINE_STEP}: the engine's optimizer step, inside the backward at the accumulation "
        "boundary (accelerate's optimizer.step() is a no-op under DeepSpeed)"
    ),
}


def wanted(plan_check: bool | None, on_cuda: bool) -> bool:
    """``plan_check`` resolved: None means on with CUDA (free) and off on the CPU (it slows the step)."""
    return on_cuda if plan_check is None else bool(plan_check)


def deepspeed_engine(trainer):
    """The DeepSpeed engine accelerate's backward steps (None before ``prepare`` or without DeepSpeed)."""
    wrapped = getattr(trainer.accelerator, "deepspeed_engine_wrapped", None)
    return getattr(wrapped, "engine", None)


class PlanCheck(TrainerCallback):
    """Measures one step after the first optimizer step and compares each phase with ``planned`` (bytes by phase,
    :attr:`video_grpo.plan.recipe.Plan.memory`). :meth:`install` wraps the trainer's phase boundaries."""

    def __init__(
        self,
        trainer,
        plan,
        output_dir: str,
        meter=None,
        replan: Callable | None = None,
        sizes_of: Callable | None = None,
    ) -> None:
        self.trainer, self.plan, self.output_dir = trainer, plan, output_dir
        self.replan = (
            replan  # (plan, self.seen) -> the plan at the measured step's sizes; None: the worst case
        )
        self.sizes_of = sizes_of  # plan -> the sizes it was made at (the record's "sizes")
        self.meter = meter or (
            CudaPeaks() if torch.cuda.is_available() and not trainer.args.use_cpu else LivePeaks()
        )
        self.armed = self.active = self.done = False
        self.current: str | None = None
        self.measured: dict[str, int] = {}  # phase -> its highest peak (bytes)
        self.at_start: dict[str, int] = {}  # phase -> bytes alive when the window of that peak began
        self.window_start = 0
        self.carried_peak = 0  # the loss window's peak before a nested optimizer step
        self.suspended: tuple[str, int, int] | None = None  # (phase, start, peak so far) around a nested step
        self.dropped: dict[str, str] = {}  # phase -> why its row is left out
        self.undo: list[Callable[[], None]] = []
        self.step: int | None = None
        # the sizes the measured step saw (:meth:`see_generation`, :meth:`see_loss`), planned again in record()
        self.seen: dict = {
            "prompt": 0,
            "answer": 0,
            "grid": None,
            "generation_rows": 0,
            "micro_batch_rows": 0,
            "loss_length": 0,  # the widest packed row of the loss forwards (shared_prefix)
            "scored": 0,  # the most answer tokens a packed micro-batch scored
        }
        self.unseen: str | None = None  # why the step's sizes could not be read, if they could not
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
                self.see(self.see_generation, prompt_ids, out[0])
            self.end("generation")
            self.begin("old_and_reference")  # until the scored batch is returned
            return out

        def score_phase(*args, **kwargs):
            if self.active:  # the batch being scored (on the CPU its decoded videos are live memory too)
                self.safely(self.meter.adopt, tensors_in((args, kwargs)))
            out = score(*args, **kwargs)
            self.end("old_and_reference")
            return out

        def loss_phase(*args, **kwargs):
            if self.current != "loss":
                self.begin("loss")
                if self.current == "loss":
                    self.see(self.see_loss, args[1] if len(args) > 1 else kwargs.get("inputs"))
            return compute_loss(*args, **kwargs)

        def step_phase(*args, **kwargs):
            out = training_step(*args, **kwargs)  # the backward is its last work (and DeepSpeed's step in it)
            self.end("loss")
            return out

        pack = getattr(trainer, "_pack", None)  # the shared prompt's packing of a forward's rows (prefix.py)

        def pack_phase(*args, **kwargs):
            packed = pack(*args, **kwargs)
            if packed is not None and self.current in ("old_and_reference", "loss"):
                self.see(self.see_packed, packed)
            return packed

        if callable(pack):
            trainer._pack = pack_phase
        trainer._generate_single_turn = generate_phase
        trainer._generate_and_score_completions = score_phase
        trainer.compute_loss = loss_phase
        trainer.training_step = step_phase
        trainer.add_callback(self)
        return self

    def hook_engine_step(self) -> None:
        """Under DeepSpeed: measure the optimizer phase around the engine's own step (the module's docstring), or
        leave the row out, saying why."""
        engine = deepspeed_engine(self.trainer)
        take_step = getattr(engine, ENGINE_STEP, None) if engine is not None else None
        if not callable(take_step):
            where = (
                "no DeepSpeed engine was prepared"
                if engine is None
                else f"{type(engine).__name__} has no {ENGINE_STEP}"
            )
            self.drop(
                "optimizer",
                f"under DeepSpeed the optimizer steps inside the backward, and {where} to measure it by",
            )
            return

        def measured_step(*args, **kwargs):
            self.begin("optimizer")
            try:
                return take_step(*args, **kwargs)
            finally:
                self.end("optimizer")

        setattr(engine, ENGINE_STEP, measured_step)
        self.undo.append(lambda: vars(engine).pop(ENGINE_STEP, None))

    def drop(self, phase: str, reason: str) -> None:
        self.dropped[phase] = reason
        logger.warning(f"plan check: the {phase} row is left out: {reason}")

    def restore(self) -> None:
        while self.undo:
            self.undo.pop()()

    # -- phases ---------------------------------------------------------------------------------------------

    def begin(self, phase: str) -> None:
        if not (self.active and self.trainer.model.training):
            return
        try:
            if phase == "optimizer" and self.current is not None:  # DeepSpeed's step, inside the loss phase
                self.suspended = (self.current, self.window_start, self.meter.end())
            self.window_start = self.meter.begin()
        except Exception as err:  # noqa: BLE001 (a failing reader ends the check, never the run)
            self.fail(err)
            return
        self.current = phase

    def end(self, phase: str) -> None:
        if not (self.active and self.current == phase):
            return
        try:
            peak = max(self.meter.end(), self.carried_peak)
            if self.suspended is not None and phase == "optimizer":  # back to the phase the step ran inside
                resumed, start, carried = self.suspended
                self.meter.begin()
        except Exception as err:  # noqa: BLE001 (a failing reader ends the check, never the run)
            self.fail(err)
            return
        if peak > self.measured.get(phase, -1):
            self.measured[phase], self.at_start[phase] = peak, self.window_start
        self.current, self.carried_peak = None, 0
        if self.suspended is not None and phase == "optimizer":
            self.current, self.window_start, self.carried_peak = resumed, start, carried
            self.suspended = None

    # -- the sizes the measured step saw ---------------------------------------------------------------------

    def see(self, call: Callable, *args) -> None:
        """Read sizes with ``call``; one that fails leaves the comparison with the worst case (never the run)."""
        try:
            call(*args)
        except Exception as err:  # noqa: BLE001 (the check never stops a run)
            self.unseen = self.unseen or f"{type(err).__name__}: {err}"

    def see_generation(self, prompt_ids, completion_ids) -> None:
        """The longest prompt and answer, the rows generated and the largest video (by patches) of the batch
        (the trainer's ``_video_rows``, which holds every row's ``video_grid_thw`` while it is generated)."""
        seen = self.seen
        seen["prompt"] = max([seen["prompt"], *map(len, prompt_ids)])
        seen["answer"] = max([seen["answer"], *map(len, completion_ids)])
        seen["generation_rows"] = max(seen["generation_rows"], len(prompt_ids))
        rows = getattr(self.trainer, "_video_rows", None)
        grids = rows.get("video_grid_thw") if isinstance(rows, dict) else None
        for grid in grids.tolist() if grids is not None else ():
            if seen["grid"] is None or math.prod(grid) > math.prod(seen["grid"]):
                seen["grid"] = tuple(int(n) for n in grid)

    def see_loss(self, inputs) -> None:
        """The rows of a micro-batch (its shape only: nothing is read back from the device)."""
        mask = inputs.get("completion_mask") if isinstance(inputs, dict) else None
        if mask is not None:
            self.seen["micro_batch_rows"] = max(self.seen["micro_batch_rows"], int(mask.shape[0]))

    def see_packed(self, packed) -> None:
        """A packed forward's width and the answer tokens it scores, each answer at its own length (its layout is
        on the CPU: nothing is read back from the device)."""
        self.seen["loss_length"] = max(
            self.seen["loss_length"], int(packed.model_inputs["input_ids"].shape[1])
        )
        self.seen["scored"] = max(self.seen["scored"], int((packed.source[..., 0] >= 0).sum()))

    def safely(self, call: Callable, *args) -> None:
        try:
            call(*args)
        except Exception as err:  # noqa: BLE001 (a failing reader ends the check, never the run)
            self.fail(err)

    def fail(self, err: Exception) -> None:
        logger.warning(
            f"plan check: stopped, its memory reader ({self.meter.name}) failed: {type(err).__name__}: {err}. "
            "Nothing is written; training goes on. Please report it (plan_check: false turns the check off)."
        )
        self.active, self.done, self.current, self.suspended = False, True, None, None
        self.restore()
        with contextlib.suppress(Exception):  # already reported
            self.meter.close()

    # -- the step measured ----------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if self.deepspeed and not self.undo and "optimizer" not in self.dropped:
            self.hook_engine_step()  # the engine exists from here on (accelerate prepared it)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.armed and not self.active and not self.done:
            try:
                self.meter.open(self.trainer)
            except Exception as err:  # noqa: BLE001 (a failing reader ends the check, never the run)
                self.active = True
                self.fail(err)
                return
            self.active, self.step = True, state.global_step + 1

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if not self.deepspeed:  # under DeepSpeed this brackets a no-op: the step is measured in the engine
            self.begin("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        if not self.deepspeed:
            self.end("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        if not self.armed:
            self.armed = True  # the first optimizer step is done: its states exist from now on
            return
        needed = [phase for phase in NEEDED if phase not in self.dropped]
        if self.active and all(phase in self.measured for phase in needed):
            self.finish()

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()
        if self.active and not self.done:
            with contextlib.suppress(Exception):  # a reader that fails here has nothing left to report
                self.meter.close()
            self.active = False
            logger.warning(
                "plan check: training ended before a whole step after the first optimizer step was measured "
                f"(phases seen: {sorted(self.measured) or 'none'}); nothing written. Run at least 2 steps."
            )

    def finish(self) -> None:
        self.active, self.done = False, True
        self.restore()
        try:
            self.meter.close()
            record = self.record()
            os.makedirs(self.output_dir, exist_ok=True)
            with open(os.path.join(self.output_dir, "plan_check.json"), "w") as f:
                json.dump(record, f, indent=2)
        except Exception as err:  # noqa: BLE001 (the check never stops a run)
            logger.warning(
                f"plan check: could not write its record ({type(err).__name__}: {err}); please report it"
            )
            return
        self.log(record)

    def log(self, record: dict) -> None:
        if record["compared_with"] != "step":
            logger.warning(f"plan check: compared with the worst-case plan: {record['compared_with']}")
        for phase, row in record["phases"].items():
            logger.warning(
                f"plan check: {phase}: planned {row['planned_gb']:.4g} GB, measured {row['measured_gb']:.4g} GB "
                f"(planned / measured {row['ratio']})"
            )
        for phase, reason in record["dropped"].items():
            logger.warning(f"plan check: {phase}: not measured ({reason})")
        peak = record["peak"]
        logger.warning(
            f"plan check: peak planned {peak['planned_gb']:.4g} GB ({peak['planned_phase']}), measured "
            f"{peak['measured_gb']:.4g} GB ({peak['measured_phase']}): ratio {peak['ratio']}"
        )
        worst, sizes = record["worst_case"], record["sizes"]
        logger.warning(
            f"plan check: the worst-case plan (prompts of {sizes['worst_case']['prompt_tokens']} tokens, answers of "
            f"{sizes['worst_case']['completion_tokens']}; this step's longest: {sizes['step']['prompt_tokens']} and "
            f"{sizes['step']['completion_tokens']}) peaks at {worst['peak_gb']:.4g} GB in {worst['peak_phase']}: "
            f"{worst['margin']}x the measured peak"
        )
        if sizes["step"]["prompt_tokens"] > sizes["worst_case"]["prompt_tokens"]:
            logger.warning(
                f"plan check: the longest prompt had {sizes['step']['prompt_tokens']} tokens, the worst-case plan "
                f"{sizes['worst_case']['prompt_tokens']} (the planner counts the prompt's text as Qwen's tokenizer "
                "does)"
            )
        if record["outside"]:
            logger.warning(
                f"plan check: the plan is off by more than {TOLERANCE:.0%} in {', '.join(record['outside'])}. Please "
                f"report it to the project's issue tracker with {os.path.join(self.output_dir, 'plan_check.json')} "
                "(it holds the plan, the measurement and the run's settings)."
            )

    def step_plan(self):
        """(the plan at the measured step's sizes, or None; why not, or "step"; seconds it took)."""
        if self.unseen is not None:
            return None, f"the step's sizes could not be read ({self.unseen})", 0.0
        if not (self.seen["prompt"] and self.seen["answer"]):
            return None, "the measured step's prompts and answers were not seen", 0.0
        if self.replan is None:
            return None, "no planner was given to plan the step at its sizes", 0.0
        started = time.perf_counter()
        try:
            plan = self.replan(self.plan, self.seen)
        except Exception as err:  # noqa: BLE001 (the check never stops a run)
            return None, f"the step could not be planned at its sizes ({type(err).__name__}: {err})", 0.0
        return plan, "step", time.perf_counter() - started

    def record(self) -> dict:
        step_plan, compared_with, seconds = self.step_plan()
        memory = (step_plan or self.plan).memory
        phases = {}
        for phase in PHASES:
            if phase in self.measured and self.measured[phase]:
                planned = memory.phases[phase].peak
                phases[phase] = {
                    "planned_gb": round(planned / GB, 6),
                    "measured_gb": round(self.measured[phase] / GB, 6),
                    "ratio": round(planned / self.measured[phase], 4),
                    # alive when the window of the measured peak began, and what the phase added to it
                    "at_start_gb": round(self.at_start[phase] / GB, 6),
                    "added_gb": round((self.measured[phase] - self.at_start[phase]) / GB, 6),
                }
        measured_phase = max(self.measured, key=self.measured.get)
        measured_peak = self.measured[measured_phase]
        peak_ratio = round(memory.peak / measured_peak, 4)
        outside = [p for p, row in phases.items() if abs(row["ratio"] - 1) > TOLERANCE]
        if abs(peak_ratio - 1) > TOLERANCE:
            outside.insert(0, "the peak")
        worst = self.plan.memory
        return {
            "device": self.meter.name,
            "rank": self.trainer.accelerator.process_index,
            "step": self.step,
            "deepspeed": self.deepspeed,
            "optimizer_window": OPTIMIZER_WINDOW[self.deepspeed],
            "dropped": dict(self.dropped),
            # "step": peak, phases and outside compare with the plan at the measured step's sizes; else why not
            "compared_with": compared_with,
            "peak": {
                "planned_gb": round(memory.peak / GB, 6),
                "planned_phase": memory.peak_phase,
                "measured_gb": round(measured_peak / GB, 6),
                "measured_phase": measured_phase,
                "ratio": peak_ratio,
            },
            "phases": phases,
            "tolerance": TOLERANCE,
            "outside": outside,
            # the run's own plan, at the recipe's worst case: its margin (planned / measured) is never flagged
            "worst_case": {
                "peak_gb": round(worst.peak / GB, 6),
                "peak_phase": worst.peak_phase,
                "margin": round(worst.peak / measured_peak, 4),
                "phases": {
                    phase: {
                        "planned_gb": round(worst.phases[phase].peak / GB, 6),
                        "margin": round(worst.phases[phase].peak / self.measured[phase], 4),
                    }
                    for phase in phases
                },
            },
            "sizes": {
                "worst_case": self.sizes_of(self.plan) if self.sizes_of else planned_lengths(self.plan),
                "step": self.sizes_of(step_plan)
                if step_plan is not None and self.sizes_of
                else self.seen_sizes(),
            },
            "replan_s": round(seconds, 3),
            "planned_bytes_by_category": {phase: dict(memory.phases[phase].by_category) for phase in PHASES},
            "plan": self.plan.as_json(),
            "step_plan": step_plan.as_json() if step_plan is not None else None,
        }

    def seen_sizes(self) -> dict:
        seen = self.seen
        return {
            "prompt_tokens": seen["prompt"],
            "completion_tokens": seen["answer"],
            "video_grid": list(seen["grid"]) if seen["grid"] else None,
            "micro_batch_rows": seen["micro_batch_rows"],
            "generation_rows": seen["generation_rows"],
            "loss_length": seen["loss_length"] or None,
            "scored_tokens": seen["scored"] or None,
        }


def planned_lengths(plan) -> dict:
    """The sizes a plan's workload states outright, for a check given no planner to ask for the rest."""
    work = plan.work
    return {
        "prompt_tokens": work.prompt_tokens,
        "completion_tokens": work.completion_tokens,
        "micro_batch_rows": work.micro_batch_rows,
        "generation_rows": work.generation_rows,
    }


def install_plan_check(
    trainer, plan, output_dir: str, replan: Callable | None = None, sizes_of: Callable | None = None
) -> PlanCheck:
    """Measure the run's second step against ``plan`` at the step's own sizes (see the module's docstring).
    ``replan`` and ``sizes_of`` are the planner's (:func:`video_grpo.plan.startup.plan_at_step`,
    :func:`~video_grpo.plan.startup.workload_sizes`), given by the command so that this package never imports the
    planner; without ``replan`` the step is compared with the worst case, and the record says so."""
    return PlanCheck(trainer, plan, output_dir, replan=replan, sizes_of=sizes_of).install()
