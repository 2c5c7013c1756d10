"""The prompt's tokens around the video, counted the way the run's processor will spell them.

The planner needs the longest prompt a recipe can build: it sizes the compiled decoder's static cache
(``decode_cache_tokens``) and every prompt-length term of the memory plan. The video placeholders follow from the
recipe's budget (:func:`video_grpo.plan.workload.worst_case_video`); the text around them depends on the
tokenizer and the chat template. A small byte-level tokenizer (the tiny CPU models) spells the default prompt in
twice as many tokens as Qwen's, so a count made once in Qwen's tokenizer plans such a prompt about a third short, and
the decoder then reallocates its cache and recompiles.

So when the run's model is a local folder with a tokenizer and a chat template, the text is counted with them:
the template rendered around the recipe's prompt with :data:`LONG_QUERY` as the query, and, for families that write
each frame pair's time as text, that text at :data:`PLANNED_SECONDS`. Otherwise (a Hub id: planned offline from
``configs/models/``) Qwen's measured counts stand in: :data:`PROMPT_TEXT_TOKENS` and :data:`TIME_TEXT_TOKENS`.
The tokenizer is loaded once per folder and nothing else is read, so the plan stays offline, quick and a function
of its inputs.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from video_grpo.inputs.families import VIDEO_BLOCK, VIDEO_PAD, ModelFamily

# The query the prompt is planned with: 30 tokens of the default prompt in Qwen's tokenizer (28 words). That is room
# for every Charades-STA query (the longest is 15 tokens) and for 95% of ActivityNet Captions' (27 tokens; their
# longest is 83); a longer query makes a longer prompt than planned.
LONG_QUERY = (
    "after talking to the camera for a while, the woman in the red coat walks back into the kitchen and picks up "
    "the small cup from the table"
)
# A recipe does not bound its videos' length: the prompt is planned for videos under 100 s, the time text of each
# frame pair at "<99.9 seconds>" and a prompt's '{duration}' at 99.90. The decoder's cache also holds one more token
# per frame pair (video_grpo.plan.workload.decode_cache_positions): "<999.9 seconds>" is one digit longer, so
# videos up to 1000 s fit it.
PLANNED_SECONDS = 99.9

PROMPT_TEXT_TOKENS = (
    160  # the default prompt with LONG_QUERY in Qwen's tokenizer and chat template (measured)
)
TIME_TEXT_TOKENS = (
    7  # "<99.9 seconds>" in Qwen's tokenizer: each digit is a token (6 under 10 s, 8 from 100 s)
)
CHARS_PER_TOKEN = 3.5  # for a recipe's own prompt_template in Qwen's counts: English text, roughly

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextAround:
    """Prompt tokens that are not video placeholders: ``fixed`` plus ``per_pair`` for each frame pair."""

    fixed: int  # the chat template, the instruction and the query (and the video's markers, when it has one block)
    per_pair: (
        int  # a frame pair's time text and its own markers, where the family writes time as text (else 0)
    )
    source: str  # how it was counted, for the plan's sources and the report

    def tokens(self, temporal_patches: int) -> int:
        return self.fixed + self.per_pair * temporal_patches


def time_as_text(family: ModelFamily) -> bool:
    """Whether each frame pair is its own block led by its time as text: Qwen3-VL and Qwen3.5, and Qwen2.5-VL with
    ``frame_timestamps_in_text``."""
    return family.time_in_text or family.text_timestamps


def qwen_counts(family: ModelFamily, prompt_template: str | None) -> tuple[int, int]:
    """(fixed, per pair) from the counts measured in Qwen's tokenizer; a recipe's own prompt is scaled by its
    characters."""
    from video_grpo.data.prompts import DEFAULT_PROMPT

    fixed = PROMPT_TEXT_TOKENS
    if prompt_template and prompt_template != DEFAULT_PROMPT:
        fixed += round(len(prompt_template) / CHARS_PER_TOKEN) - round(len(DEFAULT_PROMPT) / CHARS_PER_TOKEN)
    if time_as_text(family):
        return fixed, TIME_TEXT_TOKENS + 2  # "<t seconds>", then the pair's vision start and end
    return fixed + 2, 0  # vision start and end around the whole video


TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.json",
    "tokenizer.model",
)  # one of them holds a tokenizer's vocabulary


@functools.lru_cache(maxsize=8)
def local_tokenizer(folder: str):
    """The tokenizer saved in a model folder (nothing downloaded), or None when it has none; loaded once. A folder
    without a vocabulary file is refused first: transformers 5 builds an empty tokenizer from a config alone."""
    from transformers import AutoTokenizer

    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def tokenizer_counts(
    tokenizer, family: ModelFamily, prompt_template: str, chat_template_kwargs: dict | None
) -> tuple[int, int]:
    """(fixed, per pair) as ``tokenizer`` spells the prompt :func:`video_grpo.inputs.processing.encode_rows` builds: the
    row's messages (:func:`video_grpo.data.dataset.build_prompt`) through the chat template, the family's video text, and
    each frame pair's time as the processor writes it. Counted on whole prompts of one and two pairs, so tokens that
    merge across a boundary are counted as the processor's tokenizer counts them."""
    from video_grpo.data.dataset import build_prompt

    messages = build_prompt(LONG_QUERY, PLANNED_SECONDS, prompt_template)
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )
    text = family.prompt_text(text)
    video = VIDEO_PAD if family.time_in_text else VIDEO_BLOCK
    if text.count(video) != 1:
        raise ValueError(f"the chat template rendered {text.count(video)} video blocks, not one")

    def without_placeholders(pairs: int) -> int:
        block = (
            f"<{PLANNED_SECONDS:.1f} seconds>{VIDEO_BLOCK}" * pairs if time_as_text(family) else VIDEO_BLOCK
        )
        return len(tokenizer(text.replace(video, block))["input_ids"]) - pairs

    if not time_as_text(family):
        return without_placeholders(1), 0
    one, two = without_placeholders(1), without_placeholders(2)
    return one - (two - one), two - one


@functools.lru_cache(maxsize=64)
def _text_around(
    family: ModelFamily, prompt_template: str, model: str | None, kwargs_json: str
) -> TextAround:
    """:func:`text_around`, cached: a recipe is counted once per process (the start-up plan, auto-fit's candidates,
    the plan check and the static cache all ask)."""
    folder = Path(model) if model else None
    if folder is None or not folder.is_dir():
        fixed, per_pair = qwen_counts(family, prompt_template)
        return TextAround(fixed, per_pair, "Qwen's measured counts (no local model folder)")
    tokenizer = local_tokenizer(str(folder))
    why = f"{model} has no tokenizer" if tokenizer is None else None
    if tokenizer is not None and not tokenizer.chat_template:
        why = f"{model}'s tokenizer has no chat template"
    if why is None:
        try:
            fixed, per_pair = tokenizer_counts(tokenizer, family, prompt_template, json.loads(kwargs_json))
        except Exception as err:  # noqa: BLE001 (a template that cannot render: Qwen's counts, and the reason)
            why = f"{model}'s chat template: {type(err).__name__}: {err}"
        else:
            return TextAround(fixed, per_pair, f"{model}'s tokenizer and chat template")
    fixed, per_pair = qwen_counts(family, prompt_template)
    logger.warning(
        f"plan: the prompt's text is counted with Qwen's measured counts, not {model}'s own ({why}); a tokenizer "
        "that spells it longer makes the static decode cache grow once"
    )
    return TextAround(fixed, per_pair, f"Qwen's measured counts ({why})")


def text_around(
    family: ModelFamily,
    prompt_template: str | None,
    model: str | None = None,
    chat_template_kwargs: dict | None = None,
) -> TextAround:
    """The text around a recipe's video: counted with ``model``'s tokenizer and chat template when ``model`` is a
    local folder that has them, else from Qwen's measured counts (the module docstring says why and with what)."""
    from video_grpo.data.prompts import DEFAULT_PROMPT

    kwargs_json = json.dumps(chat_template_kwargs or {}, sort_keys=True)
    return _text_around(family, prompt_template or DEFAULT_PROMPT, model, kwargs_json)


def longest_text_around(
    family: ModelFamily,
    templates: list[str | None],
    temporal_patches: int,
    model: str | None = None,
    chat_template_kwargs: dict | None = None,
) -> TextAround:
    """:func:`text_around` for the template whose prompt is longest at ``temporal_patches`` frame pairs: a recipe
    with several training sources (``train_sources``, :mod:`video_grpo.data.sources`) writes each source's prompt with its
    own template, and the plan must hold the longest."""
    arounds = [text_around(family, template, model, chat_template_kwargs) for template in templates or [None]]
    return max(arounds, key=lambda around: around.tokens(temporal_patches))
