"""Finding a checkpoint that is safe to resume from.

Hugging Face's ``get_last_checkpoint`` returns the highest-numbered ``checkpoint-N`` folder, even one that a
killed process left half-written. The Trainer writes ``trainer_state.json`` after the weights, optimizer and
RNG states, and DeepSpeed writes its ``latest`` tag after its shards, so a folder counts as complete only
when both are there and the state parses.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

logger = logging.getLogger(__name__)
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def is_complete(folder: Path) -> bool:
    state_file = folder / "trainer_state.json"
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return False
    step = int(CHECKPOINT_RE.match(folder.name).group(1))
    if state.get("global_step") != step:
        return False
    deepspeed_shards = list(folder.glob("global_step*"))
    if deepspeed_shards and not (folder / "latest").is_file():
        return False
    return any(folder.glob("*.safetensors")) or bool(deepspeed_shards)


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete ``checkpoint-N`` in ``output_dir``; incomplete newer ones are reported and skipped."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    folders = [p for p in output_dir.iterdir() if p.is_dir() and CHECKPOINT_RE.match(p.name)]
    for folder in sorted(folders, key=lambda p: int(CHECKPOINT_RE.match(p.name).group(1)), reverse=True):
        if is_complete(folder):
            return str(folder)
        logger.warning(f"skipping {folder}: incomplete (the run was probably killed while saving it)")
    return None
