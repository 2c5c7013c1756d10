"""A reward for launched test runs that always differs within a group, so every step has nonzero advantages
and the weights must move. Given to `video_grpo.grpo` as the plug-in `tests.launch_rewards:length_reward`."""

from video_grpo.rewards import completion_text


def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(completion_text(c)) % 7) for c in completions]
