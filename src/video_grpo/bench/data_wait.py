"""Perf row ``data_wait_fraction``: the share of training time spent waiting for the next batch, with
dataloader workers vs without."""

from __future__ import annotations

import time
from pathlib import Path

from video_grpo.bench.emit import emit
from video_grpo.bench.perf_trainer import build_trainer, sample_dataset


def data_wait(model_dir: Path, work: Path, steps: int) -> None:
    dataset = sample_dataset()
    fractions = {}
    for workers in (2, 0):
        trainer = build_trainer(
            model_dir,
            work / f"wait-{workers}",
            dataset,
            True,
            max_steps=steps,
            dataloader_num_workers=workers,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
        )
        waits: list[tuple[float, float]] = []  # (when the wait ended, how long it was)
        original = trainer.get_batch_samples

        def timed(*args, original=original, waits=waits, **kwargs):
            started = time.perf_counter()
            result = original(*args, **kwargs)
            waits.append((time.perf_counter(), time.perf_counter() - started))
            return result

        trainer.get_batch_samples = timed
        trainer.train()
        ended = time.perf_counter()
        # Steady state: from the end of the first batch's wait (worker start-up, a one-off) to the end.
        steady = waits[1:]
        fractions[workers] = sum(w for _, w in steady) / (ended - waits[0][0])
    emit(
        "data_wait_fraction",
        fractions[2],
        fractions[0],
        "fraction of train time after the first batch",
        steps=steps,
        ours_setting="dataloader_num_workers=2",
        baseline_setting="dataloader_num_workers=0",
        goal="ours <= 0.05",
    )
