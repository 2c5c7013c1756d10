"""Rewards for launched test runs, given to `video_grpo.grpo` as plug-ins (`tests.launch_rewards:<name>`).

- ``length_reward`` always differs within a group, so every step has nonzero advantages and the weights must move.
- ``record_ids`` scores 0 and appends the query ids each rank trains on at each step to
  ``$VIDEO_GRPO_RECORD_IDS/ids.rank<R>.jsonl``: what a kill-and-resume test compares with the uninterrupted run.
"""

import json
import os
from pathlib import Path

from video_grpo.rewards.functions import completion_text


def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(completion_text(c)) % 7) for c in completions]


def record_ids(completions, id, trainer_state, **kwargs) -> list[float]:  # noqa: A002 (the dataset's column)
    folder = os.environ.get("VIDEO_GRPO_RECORD_IDS")
    if folder:
        rank = int(os.environ.get("RANK", 0))
        line = json.dumps({"step": trainer_state.global_step + 1, "ids": list(id)})
        with open(Path(folder) / f"ids.rank{rank}.jsonl", "a") as f:
            f.write(line + "\n")
    return [0.0] * len(completions)
