"""The SFT entry point, launched by ``accelerate launch tests/launch_probe_sft.py --config ...``, with probes
that only observe. Each rank writes ``<output_dir>/probe.rank<R>.json``:

- ``sampled_seconds``: the ``second_per_grid_ts`` the collator made from the sampled frames;
- ``model_seconds`` / ``model_dtypes``: what the model's forward received, and its dtype;

and ``end.rank<R>.json`` (``tests/launch_entry.py``): whether a process group was left after ``main`` returned.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import video_grpo.sft as entry

RECORD: dict = {"sampled_seconds": [], "model_seconds": [], "model_dtypes": [], "vision_dtype": None}


class ProbeCollator(entry.VideoSFTCollator):
    def __call__(self, rows):
        batch = super().__call__(rows)
        RECORD["sampled_seconds"] += batch["second_per_grid_ts"].double().tolist()
        return batch


class ProbeTrainer(entry.VideoSFTTrainer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.model.register_forward_pre_hook(self.record, with_kwargs=True)

    def record(self, module, args, kwargs) -> None:
        seconds = kwargs.get("second_per_grid_ts")
        if seconds is not None:
            RECORD["model_seconds"] += seconds.double().tolist()
            RECORD["model_dtypes"].append(str(seconds.dtype))
        RECORD["vision_dtype"] = str(next(module.model.visual.parameters()).dtype)


entry.VideoSFTCollator = ProbeCollator
entry.VideoSFTTrainer = ProbeTrainer

if __name__ == "__main__":
    from launch_entry import record_end  # this script's folder is on the path
    from video_grpo.runtime.distributed import exit_process

    script_args, training_args, model_args = entry.parse_args(sys.argv[1:])
    returned = entry.main(script_args, training_args, model_args)
    rank = int(os.environ.get("RANK", 0))
    (Path(training_args.output_dir) / f"probe.rank{rank}.json").write_text(json.dumps(RECORD))
    record_end(Path(training_args.output_dir), returned)
    exit_process(0)
