"""The task, budgets and training and evaluation steps the learning benchmark (:mod:`video_grpo.bench.learning`),
its curation row (:mod:`video_grpo.bench.curation`) and ``make demo`` are built from.

Each trains or answers from a saved checkpoint directory, so every comparison the benchmark makes starts from
the same weights. Everything runs in-process on CPU.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from video_grpo.data.dataset import VideoTransform
from video_grpo.data.video import SamplingConfig
from video_grpo.toys.synthetic import FlashTask

# 16-s flash videos at 2 fps: 32 frames of 28x28, one visual token per 2 frames -> 16 tokens, one per second.
SAMPLING = SamplingConfig(fps=2.0, min_frames=4, max_frames=32, min_pixels=784, max_pixels=784, max_tokens=64)
MODEL_SIZE: dict = {}  # build_tiny_model's defaults (about 0.2M parameters)
# Short prompt and answer: the tiny model copies no span from its reasoning, it writes it once.
PROMPT = (
    'When does "{sentence}" happen in this {duration}-second video? Think in <think> </think>, then give '
    '"start to end" in seconds in <answer> </answer>.'
)
ANSWER_TEMPLATE = "<think>I look for the flash.</think><answer>{start} to {end}</answer>"
# The answer-only setting (TimeLens): the same question, answered by one sentence, no tags; rewarded by IoU alone.
ANSWER_ONLY_PROMPT = (
    'When does "{sentence}" happen in this {duration}-second video? Answer with "The event happens in <start> - '
    '<end> seconds."'
)
# 8 prompts x G = 8 per step; a low temperature keeps the sampled answers close to the greedy ones tested.
GRPO_SETTINGS = {
    "per_device_train_batch_size": 64,
    "num_generations": 8,
    "max_completion_length": 40,
    "temperature": 0.4,
    "learning_rate": 3e-4,
    "lr_scheduler_type": "constant",
    "beta": 0.0,
    "loss_type": "grpo",
    "bf16": False,
    "use_cpu": True,
    "activation_checkpointing": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 1,
    "seed": 0,
    "disable_tqdm": True,
}


@dataclass(frozen=True)
class Budget:
    """Sizes of one benchmark run. The quick one keeps the task and the cold start (the same 128 training videos:
    whether 100 SFT steps make the tiny model look depends on them; on 96 videos it did not), with fewer test
    queries and GRPO steps, and leaves out the guidance and curation runs (``guided_steps`` 0, ``curate`` off).
    The suite's one (``SUITE``) is the full run without its guided and answer-only arms (``answer_only`` off: no
    second cold start, no answer-only GRPO): every run it keeps is the full run's, with the same seeds, so the rows
    it emits are the full run's rows."""

    task: FlashTask
    train: int
    test: int
    sft_steps: int
    grpo_steps: int
    guided_steps: int
    curate: bool
    answer_only: bool = True


TASK = FlashTask(size=28, clock=True)  # continuous spans, 2-4 s anywhere in 16 s
FULL = Budget(TASK, train=128, test=160, sft_steps=100, grpo_steps=80, guided_steps=80, curate=True)
QUICK = Budget(TASK, train=128, test=96, sft_steps=100, grpo_steps=40, guided_steps=0, curate=False)
# tests/test_learning.py (make test): FULL less the guided arm (80 GRPO steps) and the answer-only side (a second
# 100-step SFT, 80 GRPO steps, 3 test passes): 197 of the full run's 639 CPU s (6 December, docs/learning.md).
SUITE = Budget(
    TASK,
    train=128,
    test=160,
    sft_steps=100,
    grpo_steps=80,
    guided_steps=0,
    curate=True,
    answer_only=False,
)


def cold_start(work: Path, budget: Budget, answer_only: bool = False) -> tuple[Path, list[dict], Path]:
    """The benchmark's training videos (generator seed 10) in ``work/task`` and its SFT cold start from the tiny
    model: the one checkpoint every comparison starts from. Returns the data folder, the training records and the
    checkpoint. ``answer_only``: the same videos, model and SFT steps, taught the answer-only sentence instead
    (``work/sft_answer_only``)."""
    from video_grpo.toys.synthetic import make_flash_split
    from video_grpo.toys.tiny import build_tiny_model

    data = work / "task"
    train_records = make_flash_split(data, "train", budget.train, seed=10, task=budget.task)
    model = build_tiny_model(work / "tiny", **MODEL_SIZE)
    with contextlib.redirect_stdout(sys.stderr):
        if answer_only:
            from video_grpo.rewards.functions import ANSWER_ONLY_TEMPLATE

            dataset = task_dataset(data / "train.jsonl", prompt=ANSWER_ONLY_PROMPT)
            start = sft(
                model,
                dataset,
                work / "sft_answer_only",
                steps=budget.sft_steps,
                template=ANSWER_ONLY_TEMPLATE,
            )
        else:
            start = sft(model, task_dataset(data / "train.jsonl"), work / "sft", steps=budget.sft_steps)
    return data, train_records, start


def answer_only_start(work: Path, data: Path, budget: Budget) -> Path:
    """The answer-only cold start: the same tiny model (``work/tiny``, built by :func:`cold_start`), videos and SFT
    steps, taught ``The event happens in S - E seconds.`` (TimeLens's answer) instead of the ``<think>`` answer."""
    from video_grpo.rewards.functions import ANSWER_ONLY_TEMPLATE

    dataset = task_dataset(data / "train.jsonl", prompt=ANSWER_ONLY_PROMPT)
    with contextlib.redirect_stdout(sys.stderr):
        return sft(
            work / "tiny",
            dataset,
            work / "sft_answer_only",
            steps=budget.sft_steps,
            template=ANSWER_ONLY_TEMPLATE,
        )


def task_dataset(path: Path, prompt: str = PROMPT, **kwargs):
    """An annotation file of the flash task as the benchmark feeds it: its frame sampling and prompt, with every
    video's frames decoded once into a ``raw`` frame cache beside it (``frames/``). Raw entries hold the decoded
    uint8 frames and their timestamps as they are, so every row is what decoding gives; decoding each access
    instead (100 SFT steps of 16 rows, and every test pass, re-read the same videos) was about half of the
    benchmark's time."""
    from video_grpo.data.dataset import build_dataset
    from video_grpo.preprocess import preprocess

    cache = str(Path(path).parent / "frames")
    dataset = build_dataset(
        path, sampling=SAMPLING, prompt_template=prompt, cache_dir=cache, cache_format="raw", **kwargs
    )
    failed = preprocess(
        sorted(set(dataset.with_format(None)["video"])), SAMPLING, cache, quiet=True, fmt="raw"
    )
    assert not failed, failed  # the task's videos are generated here: each one decodes
    return dataset


def answers(
    model_dir: Path,
    dataset,
    batch_size: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    repeats: int = 1,
) -> list[dict]:
    """Greedy (or sampled, ``repeats`` per query) answers of ``model_dir`` to every query, as prediction records."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from video_grpo.evaluate import generate_answers, prediction_record

    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    indices = [i for i in range(len(dataset)) for _ in range(repeats)]
    records = []
    for start in range(0, len(indices), batch_size):
        rows = dataset.__getitems__(indices[start : start + batch_size])
        outputs = generate_answers(
            model,
            processor,
            rows,
            max_new_tokens=GRPO_SETTINGS["max_completion_length"],
            do_sample=do_sample,
            temperature=temperature,
        )
        records += [prediction_record(row, out) for row, out in zip(rows, outputs, strict=True)]
    return records


def test_metrics(model_dir: Path, dataset) -> dict:
    """R1@{0.3,0.5,0.7}, mIoU (%) and the share of answers in the exact format (%), greedy."""
    from video_grpo.evaluate import score_records
    from video_grpo.rewards.functions import format_reward

    records = answers(model_dir, dataset)
    metrics = score_records(records)
    formats = format_reward(completions=[r["output"] for r in records])
    return {
        **{k: v for k, v in metrics.items() if k.startswith("R1@") or k == "mIoU"},
        "format": 100.0 * sum(formats) / len(formats),
        "parsed": 100.0 * (1 - metrics["num_parse_failures"] / len(records)),
        "records": records,
    }


# The cold start's SFTConfig settings (the demo's too: scripts/demo_flash.py prepare).
SFT_SETTINGS = {
    "per_device_train_batch_size": 16,
    "lr_scheduler_type": "constant",
    "bf16": False,
    "use_cpu": True,
    "activation_checkpointing": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 10,
    "remove_unused_columns": False,
    "dataset_kwargs": {"skip_prepare_dataset": True},
    "disable_tqdm": True,
}


def sft(
    model_dir: Path,
    dataset,
    out: Path,
    steps: int,
    learning_rate: float = 3e-3,
    seed: int = 0,
    template: str = ANSWER_TEMPLATE,
) -> Path:
    """Supervised answers in the prompt's format (``dataset``'s spans) -> a checkpoint in ``out``."""
    from transformers import AutoProcessor
    from trl import SFTConfig, SFTTrainer

    from video_grpo.inputs.families import QWEN2_5_VL
    from video_grpo.sft import VideoSFTCollator

    processor = AutoProcessor.from_pretrained(model_dir)
    args = SFTConfig(
        output_dir=str(out), max_steps=steps, learning_rate=learning_rate, seed=seed, **SFT_SETTINGS
    )
    trainer = SFTTrainer(
        model=str(model_dir),
        args=args,
        train_dataset=dataset,
        data_collator=VideoSFTCollator(processor, template, QWEN2_5_VL),
        processing_class=processor,
    )
    trainer.train()
    trainer.save_model(str(out))
    processor.save_pretrained(str(out))
    return out


class FramesInPrompt(VideoTransform):
    """What a plain TRL user does with a video dataset: the frames go into the prompt's video block, so TRL's
    generation sees them (its loss forward does not: TRL 1.16 routes only images)."""

    def __call__(self, batch):
        batch = super().__call__(batch)
        for prompt, frames in zip(batch["prompt"], batch["video_frames"], strict=True):
            prompt[0]["content"][0] = {"type": "video", "video": frames}
        return batch


class BlankFrames(VideoTransform):
    """Every frame blacked out: same prompts, same timing, nothing to see."""

    def __call__(self, batch):
        batch = super().__call__(batch)
        batch["video_frames"] = [torch.zeros_like(f) for f in batch["video_frames"]]
        return batch


def with_transform(dataset, transform_class, prompt: str = PROMPT):
    """A copy of a ``build_dataset`` dataset whose rows go through ``transform_class`` instead (reading the same
    frame cache)."""
    current = dataset.format["format_kwargs"]["transform"]
    dataset = dataset.with_format(None)
    dataset.set_transform(
        transform_class(
            SAMPLING, prompt, records=None, cache_dir=current.cache_dir, cache_format=current.cache_format
        )
    )
    return dataset


def recording_iou(group_stds: list[float], group_size: int):
    """``iou_reward`` (same name, so the logs keep their keys) that appends each group's population IoU std to
    ``group_stds``. In one process the reward sees the whole generation batch, G consecutive rows per prompt."""
    from video_grpo.rewards.functions import iou_reward as base

    def iou_reward(completions, **kwargs) -> list[float]:
        rewards = base(completions=completions, **kwargs)
        for start in range(0, len(rewards), group_size):
            group = torch.tensor(rewards[start : start + group_size], dtype=torch.float64)
            group_stds.append(float(group.std(unbiased=False)))
        return rewards

    return iou_reward


def recording_rollouts(reward: Callable, groups: list[dict], group_size: int) -> Callable:
    """``reward`` (same ``__name__``, so the logs keep their keys, and the same values) that appends each group of
    ``group_size`` consecutive answers it scores to ``groups``: their texts and the ``solution`` and ``duration``
    columns. In one process the reward sees the whole generation batch, G consecutive rows per prompt."""
    from video_grpo.rewards.functions import completion_text

    def recorded(completions, **kwargs) -> list[float]:
        rewards = reward(completions=completions, **kwargs)
        durations = kwargs.get("duration")
        for start in range(0, len(completions), group_size):
            rows = range(start, min(start + group_size, len(completions)))
            groups.append(
                {
                    "completions": [completion_text(completions[i]) for i in rows],
                    "solution": [kwargs["solution"][i] for i in rows],
                    "duration": [durations[i] if durations is not None else None for i in rows],
                }
            )
        return rewards

    recorded.__name__ = reward.__name__
    return recorded


@contextlib.contextmanager
def guidance_variant(**options):
    """Run ``VideoGRPOTrainer`` with :func:`video_grpo.loss.guidance.group_advantages` ``options`` (``tau``,
    ``miss_below``). The trainer has no setting for them, so the benchmark swaps the function it calls, for this
    block only."""
    from video_grpo import trainer
    from video_grpo.loss.guidance import group_advantages

    original = trainer.group_advantages
    trainer.group_advantages = functools.partial(group_advantages, **options)
    try:
        yield
    finally:
        trainer.group_advantages = original


def grpo(
    model_dir: Path,
    dataset,
    out: Path,
    steps: int,
    plain: bool = False,
    save: bool = True,
    guidance_options: dict | None = None,
    group_stds: list[float] | None = None,
    seed: int = GRPO_SETTINGS["seed"],
    answer_only: bool = False,
    rollouts: list[dict] | None = None,
    extra_rewards: tuple[str, ...] = (),
    extra_reward_params: dict[str, dict] | None = None,
    accuracy_reward: Callable | None = None,
    config: dict | None = None,
    **trainer_kwargs,
) -> list[dict]:
    """GRPO with the ``iou`` and ``format`` rewards from ``model_dir``; returns the per-step log.

    ``plain``: TRL's own ``GRPOTrainer``, fed the frames in the prompt; otherwise ``VideoGRPOTrainer``
    (``trainer_kwargs``: its options, e.g. ``gt_guidance``; ``guidance_options``: see :func:`guidance_variant`).
    Same config either way. ``group_stds``: if given, the IoU reward's std within every group of every step is
    appended to it (population std over the G answers to one prompt: the spread GRPO's advantages come from).
    ``seed``: the trainer's seed (prompt order and sampling). ``answer_only``: the reward is ``iou_answer_only``
    alone (TimeLens: no format term); its log entries carry ``rewards/iou_reward/mean`` too, so every row reads
    the same key. ``rollouts``: if given, every group of sampled answers the IoU reward scores is appended to it
    (:func:`recording_rollouts`, for :mod:`video_grpo.bench.twass_rows`). ``extra_rewards``: registry names trained with
    besides ``iou`` and ``format`` (weight 1 each, e.g. ``("twass",)``), with their parameters in
    ``extra_reward_params`` (``{"twass": {"beta": 3.0}}``). ``accuracy_reward``: the first reward instead of
    ``iou`` (e.g. ``tiou`` with ``reader: ours``; the log entries returned are those that carry its mean, under its
    name). ``config``: ``GRPOConfig`` settings over ``GRPO_SETTINGS`` (e.g. ``{"scale_rewards": "none"}``)."""
    from transformers import AutoConfig, AutoProcessor
    from trl import GRPOConfig, GRPOTrainer

    from video_grpo.inputs.processing import vision_placeholder_ids
    from video_grpo.rewards.functions import format_reward, iou_reward
    from video_grpo.trainer import VideoGRPOTrainer

    processor = AutoProcessor.from_pretrained(model_dir)
    trainer_processor = AutoProcessor.from_pretrained(model_dir)
    if plain:  # the same frame size as ours; TRL passes no frame timestamps, so the processor assumes 24 fps
        pixels = {"shortest_edge": SAMPLING.min_pixels, "longest_edge": SAMPLING.max_pixels}
        trainer_processor.video_processor.size = pixels
    # A sampled <|video_pad|> would break the next forward; a TRL user has to suppress it too.
    suppress = vision_placeholder_ids(AutoConfig.from_pretrained(model_dir))
    settings = {**GRPO_SETTINGS, "seed": seed, **(config or {})}
    args = GRPOConfig(
        output_dir=str(out), max_steps=steps, generation_kwargs={"suppress_tokens": suppress}, **settings
    )
    trainer_class = GRPOTrainer if plain else VideoGRPOTrainer
    data = with_transform(dataset, FramesInPrompt) if plain else dataset
    accuracy = iou_reward if group_stds is None else recording_iou(group_stds, args.num_generations)
    if accuracy_reward is not None:
        assert group_stds is None and not answer_only, (
            "accuracy_reward replaces iou: no group_stds, answer_only"
        )
        accuracy = accuracy_reward
    if answer_only:
        from video_grpo.rewards.functions import iou_answer_only_reward

        def answer_only_iou(completions, **kwargs) -> list[float]:
            return iou_answer_only_reward(completions=completions, **kwargs)

        answer_only_iou.__name__ = "iou_reward"  # TRL logs a reward under its name: the rows share one key
        accuracy = answer_only_iou
    if rollouts is not None:
        accuracy = recording_rollouts(accuracy, rollouts, args.num_generations)
    from video_grpo.rewards.functions import resolve_reward_funcs

    extra = resolve_reward_funcs(list(extra_rewards), extra_reward_params)
    trainer = trainer_class(
        model=str(model_dir),
        reward_funcs=[accuracy, *extra] if answer_only else [accuracy, *extra, format_reward],
        args=args,
        train_dataset=data,
        processing_class=trainer_processor,
        **trainer_kwargs,
    )
    with guidance_variant(**guidance_options) if guidance_options else contextlib.nullcontext():
        trainer.train()
    if save:
        trainer.save_model(str(out))
        processor.save_pretrained(str(out))
    key = f"rewards/{accuracy.__name__}/mean"
    return [e for e in trainer.state.log_history if key in e]
