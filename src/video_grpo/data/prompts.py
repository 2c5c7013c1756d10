"""The default prompt and the conversational prompt a row gets: the video first, then the instruction.

Kept apart from the dataset so that the recipe configs (``video_grpo.configs``) can name the default without
loading the dataset's dependencies.
"""

DEFAULT_PROMPT = (
    'To accurately pinpoint the event "{sentence}" in the video, determine the precise time period of the '
    "event.\n\nOutput your thought process within the <think> </think> tags, including analysis with either "
    "specific time ranges (xx.xx to xx.xx) in <think> </think> tags.\n\nThen, provide the start and end times "
    '(in seconds, precise to two decimal places) in the format "start time to end time" within the '
    '<answer> </answer> tags. For example: "12.54 to 17.83".'
)


def build_prompt(sentence: str, duration: float, template: str = DEFAULT_PROMPT) -> list[dict]:
    """The conversational prompt: the video first, then the instruction."""
    text = template.replace("{sentence}", sentence).replace("{duration}", f"{duration:.2f}")
    return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]
