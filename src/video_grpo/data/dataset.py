"""Grounding datasets: annotations -> ``datasets.Dataset`` whose rows decode their video lazily, on access.

Frames are attached through ``Dataset.set_transform``, so decoding happens when a row is *accessed*: for
``ds[i]``, ``ds[[i, j]]``, DataLoader batches of any size (in worker processes when
``dataloader_num_workers`` > 0), and after ``.shuffle()`` / ``.select()``. Within one access a video repeated
across rows (GRPO repeats each prompt G times) is decoded once and shared.

Check a dataset before spending GPU hours on it with ``python -m video_grpo.data check`` (:mod:`video_grpo.data.check`).

A training row whose video cannot be read is not dropped: :class:`VideoTransform` puts another row in its place
(the same one for the G repeats of a prompt), and that row is what the rewards score and the policy trains on.
Its ``drawn_row_index`` still names the row the sampler drew, so the logged draw weight and the count of prompts
seen are the drawn query's; with TimeLens2's draw weights the replacement itself is drawn by those weights, so the
queries trained keep the drawn distribution p.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch
from datasets import Dataset

from video_grpo.data.annotations import DEFAULT_EXTENSIONS, AnnotationError, DataReport
from video_grpo.data.frame_cache import DEFAULT_CACHE_FORMAT, load_video
from video_grpo.data.prompts import DEFAULT_PROMPT, build_prompt
from video_grpo.data.sources import DataSource, load_source, load_sources, recipe_sources
from video_grpo.data.video import SamplingConfig, VideoReadError

logger = logging.getLogger(__name__)


class VideoTransform:
    """``set_transform`` callable: adds ``prompt``, ``video_frames``, ``video_metadata``, ``bad_sample`` and
    ``drawn_row_index``.

    A row whose video cannot be read is replaced by another row, chosen deterministically from its
    ``row_index`` (so the G repeats of a prompt get the same replacement): every column then holds the
    replacement's values, ``row_index`` and ``id`` included, so the rewards score the query actually trained on,
    while ``drawn_row_index`` keeps the index of the row the sampler drew, so what is logged about the draw
    (``sample_weight/relative_weight``) and the count of prompts seen are about the drawn query. ``bad_sample``
    names the failed file and the reason, and the trainer counts and logs it. The replacement is drawn uniformly
    among the rows, or, once the trainer sets ``replacement_weights`` (TimeLens2's draw weights,
    :func:`set_replacement_weights`), with those probabilities: the query trained in place of a bad one is then
    drawn as the sampler draws, and the trained distribution stays p. Without ``records`` (the rows to draw
    replacements from) a bad video raises :class:`VideoReadError`.

    A plain class (not a closure) so the dataset pickles into DataLoader worker processes.
    """

    max_replacement_tries = 32

    def __init__(
        self,
        sampling: SamplingConfig,
        prompt_template: str = DEFAULT_PROMPT,
        cache_dir: str | None = None,
        records: list[dict] | None = None,
        cache_format: str = DEFAULT_CACHE_FORMAT,
        source_templates: dict[str, str] | None = None,
    ):
        self.sampling = sampling
        self.prompt_template = prompt_template
        self.cache_dir = cache_dir
        self.records = records
        self.cache_format = cache_format
        self.source_templates = source_templates or {}  # data_source -> its prompt template
        self.replacement_weights: torch.Tensor | None = None

    def _load(self, path: str, decoded: dict):
        if path not in decoded:  # the G repeats of a prompt share one decode
            try:
                decoded[path] = load_video(path, self.sampling, self.cache_dir, self.cache_format)
            except VideoReadError as err:
                decoded[path] = err
        return decoded[path]

    def replacement_candidates(self, row_index: int) -> list[int]:
        """The rows tried, in order, in place of row ``row_index``: a function of it alone, so every repeat of a
        prompt (and every rank) gets the same; by ``replacement_weights`` when set, else uniform."""
        tries = min(len(self.records), self.max_replacement_tries)
        if self.replacement_weights is None:
            return random.Random(row_index).sample(range(len(self.records)), tries)
        generator = torch.Generator().manual_seed(row_index)
        return torch.multinomial(
            self.replacement_weights, tries, replacement=False, generator=generator
        ).tolist()

    def _replacement(self, row_index: int, decoded: dict) -> tuple[dict, object]:
        candidates = self.replacement_candidates(row_index)
        for candidate in candidates:
            record = self.records[candidate]
            video = self._load(record["video"], decoded)
            if not isinstance(video, VideoReadError):
                return record, video
        raise VideoReadError(
            self.records[row_index]["video"],
            f"it and {len(candidates)} replacement candidates are all unreadable",
        )

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        batch = {key: list(values) for key, values in batch.items()}
        rows = len(batch["video"])
        if "row_index" in batch:  # kept through a replacement, which overwrites row_index
            batch["drawn_row_index"] = list(batch["row_index"])
        decoded: dict = {}
        frames, metadata, bad = [], [], []
        for i in range(rows):
            video = self._load(batch["video"][i], decoded)
            problem = None
            if isinstance(video, VideoReadError):
                if self.records is None or "row_index" not in batch:
                    raise video
                problem = str(video)
                record, video = self._replacement(batch["row_index"][i], decoded)
                for key, value in record.items():
                    if key in batch and key != "drawn_row_index":
                        batch[key][i] = value
            frames.append(video.frames)
            metadata.append(video.metadata)
            bad.append(problem)
        batch["video_frames"], batch["video_metadata"], batch["bad_sample"] = frames, metadata, bad
        sources = batch.get("data_source") or [None] * rows  # a replaced row takes its replacement's source
        batch["prompt"] = [
            build_prompt(s, d, self.source_templates.get(source, self.prompt_template))
            for s, d, source in zip(batch["sentence"], batch["duration"], sources, strict=True)
        ]
        return batch


def build_dataset(
    annotation_file: str | Path,
    video_root: str | Path | None = None,
    sampling: SamplingConfig | None = None,
    prompt_template: str = DEFAULT_PROMPT,
    max_samples: int | None = None,
    dataset_format: str | None = None,
    durations_file: str | Path | None = None,
    video_extensions: tuple[str, ...] = DEFAULT_EXTENSIONS,
    strict: bool = False,
    cache_dir: str | None = None,
    allow_absolute_video_paths: bool = False,
    replace_bad_samples: bool = True,
    cache_format: str = DEFAULT_CACHE_FORMAT,
    normalize_query: bool = False,
) -> Dataset:
    """A ``Dataset`` whose rows decode their video on access. See :mod:`video_grpo.data.annotations` for formats.

    ``replace_bad_samples``: for training, a row whose video cannot be read becomes another row; evaluation
    turns it off, so every query is answered for itself or reported as failed. ``cache_dir`` and
    ``cache_format``: where and in which format (:mod:`video_grpo.data.frame_cache`) to look for stored frames.
    ``normalize_query``: fold whitespace and drop trailing periods of each query (TimeLens2's ``parse_query``)."""
    source = DataSource(
        None,
        str(annotation_file),
        dataset_format,
        None if video_root is None else str(video_root),
        None if durations_file is None else str(durations_file),
        prompt_template,
        normalize_query,
    )
    records, report = load_source(source, tuple(video_extensions), strict, allow_absolute_video_paths)
    return _lazy_dataset(
        records,
        [(source, report)],
        max_samples,
        VideoTransform(sampling or SamplingConfig(), prompt_template, cache_dir, None, cache_format),
        replace_bad_samples,
    )


def build_sources_dataset(
    sources: list[DataSource],
    sampling: SamplingConfig | None = None,
    max_samples: int | None = None,
    video_extensions: tuple[str, ...] = DEFAULT_EXTENSIONS,
    strict: bool = False,
    cache_dir: str | None = None,
    allow_absolute_video_paths: bool = False,
    replace_bad_samples: bool = True,
    cache_format: str = DEFAULT_CACHE_FORMAT,
    prompt_template: str = DEFAULT_PROMPT,
) -> Dataset:
    """:func:`build_dataset` over several named sources (:mod:`video_grpo.data.sources`): their rows in order, ids
    ``<source>/<id>``, each row's prompt from its source's template (``prompt_template`` for none)."""
    records, reports = load_sources(sources, tuple(video_extensions), strict, allow_absolute_video_paths)
    transform = VideoTransform(
        sampling or SamplingConfig(),
        prompt_template,
        cache_dir,
        None,
        cache_format,
        {source.name: source.prompt_template for source in sources},
    )
    return _lazy_dataset(records, reports, max_samples, transform, replace_bad_samples)


def _lazy_dataset(
    records: list[dict],
    reports: list[tuple[DataSource, DataReport]],
    max_samples: int | None,
    transform: VideoTransform,
    replace_bad_samples: bool,
) -> Dataset:
    """The first ``max_samples`` records as a ``Dataset``, rows numbered, frames decoded on access by
    ``transform`` (which draws replacements from these rows when ``replace_bad_samples``); each source's skipped,
    clamped and missing items logged."""
    if max_samples is not None:
        records = records[:max_samples]
    if not records:
        invalid = sum(len(report.invalid_spans) for _, report in reports)
        where = ", ".join(
            source.train_file if source.name is None else source.describe() for source, _ in reports
        )
        raise AnnotationError(f"{where}: no usable records ({invalid} invalid spans)")
    for index, record in enumerate(records):
        record["row_index"] = index
    dataset = Dataset.from_list(records)
    transform.records = records if replace_bad_samples else None
    dataset.set_transform(transform)
    for source, report in reports:
        if report.invalid_spans or report.clamped_spans or report.missing_videos:
            logger.warning(
                f"{source.train_file if source.name is None else source.describe()}: {report.records} queries; "
                f"skipped {len(report.invalid_spans)} with start >= end, clamped {len(report.clamped_spans)} ending "
                f"after their video, {len(report.missing_videos)} videos missing (run `python -m video_grpo.data "
                "check` for the list)"
            )
    return dataset


def set_replacement_weights(dataset: Dataset, probabilities: torch.Tensor) -> None:
    """Draw the replacement of a bad video by ``probabilities`` (one per row), as the sampler draws the rows
    (:class:`VideoTransform`). The transform is held by reference, so DataLoader workers started later get it."""
    transform = dataset.format.get("format_kwargs", {}).get("transform")
    if isinstance(transform, VideoTransform) and transform.records is not None:
        if len(probabilities) != len(transform.records):
            raise ValueError(
                f"replacement weights: {len(probabilities)} for {len(transform.records)} rows of the dataset"
            )
        transform.replacement_weights = probabilities.double()


def dataset_kwargs(script_args, family) -> dict:
    """``build_dataset`` keyword arguments from ``GRPOScriptArguments`` and the model family (frame geometry)."""
    return {
        "video_root": script_args.video_root,
        "sampling": SamplingConfig.from_args(script_args, family),
        "prompt_template": script_args.prompt_template,
        "dataset_format": script_args.dataset_format,
        "durations_file": script_args.durations_file,
        "video_extensions": tuple(script_args.video_extensions),
        "strict": script_args.strict_data,
        "cache_dir": script_args.frame_cache_dir,
        "cache_format": script_args.frame_cache_format,
        "allow_absolute_video_paths": script_args.allow_absolute_video_paths,
    }


def build_train_dataset(
    script_args, family, max_samples: int | None = None, replace_bad_samples: bool = True
) -> Dataset:
    """The recipe's training rows: its ``train_sources`` (:mod:`video_grpo.data.sources`) or its ``train_file``."""
    kwargs = dataset_kwargs(script_args, family)
    if not script_args.train_sources:
        return build_dataset(
            script_args.train_file,
            max_samples=max_samples,
            replace_bad_samples=replace_bad_samples,
            normalize_query=script_args.normalize_query,
            **kwargs,
        )
    return build_sources_dataset(
        recipe_sources(script_args),
        kwargs["sampling"],
        max_samples,
        kwargs["video_extensions"],
        kwargs["strict"],
        kwargs["cache_dir"],
        kwargs["allow_absolute_video_paths"],
        replace_bad_samples,
        kwargs["cache_format"],
        script_args.prompt_template,
    )


def build_datasets(script_args, family) -> tuple[Dataset, Dataset | None]:
    """Train and (optional) eval datasets from ``GRPOScriptArguments``, sampled for ``family``."""
    train = build_train_dataset(script_args, family, script_args.max_train_samples)
    evaluation = None
    if script_args.eval_file:
        kwargs = dataset_kwargs(script_args, family)
        evaluation = build_dataset(
            script_args.eval_file, normalize_query=script_args.normalize_query, **kwargs
        )
    return train, evaluation
