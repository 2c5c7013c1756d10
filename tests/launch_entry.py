"""Run an entry point's ``main`` under ``accelerate launch``, then record how the rank left it:

    accelerate launch ... tests/launch_entry.py --record DIR video_grpo.evaluate run --config ...

Each rank writes ``DIR/end.rank<R>.json`` with ``process_group_after_main`` (whether a torch process group was
still initialised when ``main`` returned) and ``returned`` (``main``'s return value), then exits with it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import torch


def run(argv: list[str]) -> int:
    if argv[:1] != ["--record"] or len(argv) < 3:
        raise SystemExit("usage: launch_entry.py --record DIR MODULE [ARGS...]")
    record, module_name, args = Path(argv[1]), argv[2], argv[3:]
    module = importlib.import_module(module_name)
    sys.argv = [module_name, *args]
    # grpo, sft: main(script_args, training_args, model_args); evaluate, curate: main(argv) -> exit code
    parsed = module.parse_args(args) if hasattr(module, "parse_args") else (args,)
    returned = module.main(*parsed)
    record_end(record, returned)
    return int(returned or 0)


def record_end(record: Path, returned=None) -> None:
    """Write ``record/end.rank<R>.json``: call it right after an entry point's ``main`` returned."""
    record.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", 0))
    (record / f"end.rank{rank}.json").write_text(
        json.dumps({"process_group_after_main": torch.distributed.is_initialized(), "returned": returned})
    )


def ended_in_order(record: Path, ranks: int = 2) -> list[dict]:
    """The ranks' end records; asserts each exists and shows no process group left after ``main``."""
    ends = [json.loads((record / f"end.rank{rank}.json").read_text()) for rank in range(ranks)]
    assert all(not end["process_group_after_main"] for end in ends), ends
    return ends


if __name__ == "__main__":
    from video_grpo.runtime.distributed import exit_process

    exit_process(run(sys.argv[1:]))
