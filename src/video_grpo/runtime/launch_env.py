"""The launch as ``accelerate launch`` describes it to the processes it starts: environment variables, read
before anything is built (the recipe's checks, the start-up plan)."""

from __future__ import annotations

import json
import os


def deepspeed_launch() -> bool:
    """Whether ``accelerate launch`` started this process with a DeepSpeed config."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def launch_from_environment() -> dict:
    """The launch as ``accelerate launch`` describes it to its processes (environment variables)."""
    return {
        "num_processes": int(os.environ.get("WORLD_SIZE", "1")),
        "zero_stage": _zero_stage_from_environment() if deepspeed_launch() else 0,
        "offload_optimizer": os.environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none")
        != "none",
        "offload_params": os.environ.get("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "none") != "none",
        "mixed_precision": os.environ.get("ACCELERATE_MIXED_PRECISION"),
    }


def _zero_stage_from_environment() -> int:
    """The ZeRO stage of an accelerate launch: its accelerate config's ``zero_stage``, or, for a launch with a
    ``deepspeed_config_file`` (which sets no stage variable), that JSON file's ``zero_optimization.stage``."""
    if "ACCELERATE_DEEPSPEED_ZERO_STAGE" in os.environ:
        return int(os.environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"])
    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if not path:
        return 0
    with open(path, encoding="utf-8") as file:
        return int(json.load(file).get("zero_optimization", {}).get("stage", 0))
