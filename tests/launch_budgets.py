"""The training entry point launched with another auto-fit budget on each rank, as on cards of different memory:

    accelerate launch ... tests/launch_budgets.py 1.3,1.15 --config ... --auto_fit true

Rank R plans for the R-th budget (its ``--auto_fit_memory_gb``, which is the device memory a CPU run fits for);
everything else is the real entry point. Each rank writes ``<output_dir>/fit.rank<R>.json``: its budget, the
fields its budget alone would change (``fit_for_device``, no collective) and the fields it applied with the
launch's one fit (``apply_auto_fit``), before and after.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import video_grpo.grpo as entry
from video_grpo.plan import startup

FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "gradient_checkpointing",
    "ds3_gather_for_generation",
)
apply_auto_fit = entry.apply_auto_fit


def recording_apply_auto_fit(script_args, training_args, model_args) -> None:
    alone = startup.fit_for_device(
        script_args,
        training_args,
        model_args,
        startup.run_device(training_args, script_args.auto_fit_memory_gb),
    )
    before = {name: getattr(training_args, name) for name in FIELDS}
    apply_auto_fit(script_args, training_args, model_args)
    record = {
        "budget_gb": script_args.auto_fit_memory_gb,
        "alone": alone.fields,
        "before": before,
        "applied": {name: getattr(training_args, name) for name in FIELDS},
    }
    out = Path(training_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"fit.rank{training_args.process_index}.json").write_text(json.dumps(record))


entry.apply_auto_fit = recording_apply_auto_fit

if __name__ == "__main__":
    from video_grpo.runtime.distributed import exit_process

    budgets = sys.argv[1].split(",")
    budget = budgets[int(os.environ.get("RANK", 0))]
    script_args, training_args, model_args = entry.parse_args([*sys.argv[2:], "--auto_fit_memory_gb", budget])
    entry.main(script_args, training_args, model_args)
    exit_process(0)
