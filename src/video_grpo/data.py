"""Grounding datasets: annotations -> ``datasets.Dataset`` whose rows decode their video lazily, on access.

Frames are attached through ``Dataset.set_transform``, so decoding happens when a row is *accessed*: for
``ds[i]``, ``ds[[i, j]]``, DataLoader batches of any size (in worker processes when
``dataloader_num_workers`` > 0), and after ``.shuffle()`` / ``.select()``. Within one access a video repeated
across rows (GRPO repeats each prompt G times) is decoded once and shared.

Check a dataset before spending GPU hours on it::

    python -m video_grpo.data check --config configs/grpo/qwen2_5_vl_7b_charades.yaml [--decode] [--json]
    python -m video_grpo.data check --annotations charades_sta_test.txt --durations Charades_v1_test.csv \\
        --video_root /data/Charades_v1

It exits with status 1 when the data could not train (no usable query, or a missing or unreadable video)
and 2 when the annotations themselves are malformed. For a recipe with ``train_sources`` (several annotation
sources, :mod:`video_grpo.sources`) it checks and reports each source, and every error names its source.

A training row whose video cannot be read is not dropped: :class:`VideoTransform` puts another row in its place
(the same one for the G repeats of a prompt), and that row is what the rewards score and the policy trains on.
Its ``drawn_row_index`` still names the row the sampler drew, so the logged draw weight and the count of prompts
seen are the drawn query's; with TimeLens2's draw weights the replacement itself is drawn by those weights, so the
queries trained keep the drawn distribution p.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from pathlib import Path

import torch
from datasets import Dataset
from tqdm.auto import tqdm

from video_grpo.annotations import DEFAULT_EXTENSIONS, AnnotationError, DataReport, load_annotations
from video_grpo.configs import DEFAULT_PROMPT
from video_grpo.families import FAMILIES, family_of_recipe
from video_grpo.frame_cache import DEFAULT_CACHE_FORMAT, load_video
from video_grpo.sources import DataSource, load_source, load_sources, recipe_sources
from video_grpo.video import SamplingConfig, VideoReadError, probe_video, read_video

logger = logging.getLogger(__name__)


def build_prompt(sentence: str, duration: float, template: str = DEFAULT_PROMPT) -> list[dict]:
    """The conversational prompt: the video first, then the instruction."""
    text = template.replace("{sentence}", sentence).replace("{duration}", f"{duration:.2f}")
    return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]


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
    """A ``Dataset`` whose rows decode their video on access. See :mod:`video_grpo.annotations` for formats.

    ``replace_bad_samples``: for training, a row whose video cannot be read becomes another row; evaluation
    turns it off, so every query is answered for itself or reported as failed. ``cache_dir`` and
    ``cache_format``: where and in which format (:mod:`video_grpo.frame_cache`) to look for stored frames.
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
    """:func:`build_dataset` over several named sources (:mod:`video_grpo.sources`): their rows in order, ids
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
    """The recipe's training rows: its ``train_sources`` (:mod:`video_grpo.sources`) or its ``train_file``."""
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


# -- python -m video_grpo.data check ------------------------------------------------------------------------


def check_videos(
    report: DataReport,
    videos: list[str],
    sampling: SamplingConfig | None,
    quiet: bool,
    lengths: dict[str, float] | None = None,
) -> None:
    """Open (or, with ``sampling``, decode) every present video; unreadable ones go into ``report``. With
    ``lengths``, each readable video's length (frames / average fps) is put in it, keyed by path."""
    missing = set(report.missing_videos)
    present = [v for v in videos if v not in missing]
    for video in tqdm(
        present, desc="decoding videos" if sampling else "reading headers", disable=quiet, unit="video"
    ):
        try:
            header = probe_video(video) if lengths is not None or not sampling else None
            if sampling:
                read_video(video, sampling)
            if lengths is not None:
                lengths[video] = header["total_num_frames"] / header["fps"]
        except VideoReadError as err:
            report.unreadable_videos.append(f"{video}: {err.reason}")


def write_durations(path: str, lengths: dict[str, float], video_root: Path) -> None:
    """``id,length`` rows, a ``durations_file``: the id is the video's path under ``video_root`` without its
    extension (TimeLens2-93K's ``video_id``), so loading with it reads no video header."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("id,length\n")
        for video, length in sorted(lengths.items()):
            key = Path(video).with_suffix("")
            key = key.relative_to(video_root) if key.is_relative_to(video_root) else key
            f.write(f"{key},{length!r}\n")


def format_summary(annotations: str, report: DataReport, decoded: bool) -> str:
    lines = [
        f"annotations      {annotations}",
        f"records          {report.records} usable queries over {report.videos} videos",
        f"invalid spans    {len(report.invalid_spans)} skipped (start >= end)",
        f"clamped spans    {len(report.clamped_spans)} (end after the video, set to its duration)",
        f"missing videos   {len(report.missing_videos)}",
        f"unreadable       {len(report.unreadable_videos)} ({'decoded' if decoded else 'headers checked'})",
    ]
    for title, items in (("missing", report.missing_videos), ("unreadable", report.unreadable_videos)):
        for item in items[:10]:
            lines.append(f"  {title}: {item}")
        if len(items) > 10:
            lines.append(f"  ... and {len(items) - 10} more {title}")
    lines.append(
        "OK: the data can train." if report.can_train else "NOT READY: fix the items above before training."
    )
    return "\n".join(lines)


def missing_recipe_paths(script_args, config: str, names: tuple[str, ...]) -> list[str]:
    """One message per path field of the recipe ``config`` that is set but names no file (no directory, for
    ``video_root``): the field, the path, and what to fix. Checked up front, so a tool never stops on a bare
    ``[Errno 2]``."""
    import os

    problems = []
    for name in names:
        path = getattr(script_args, name)
        if not path:
            continue
        want_dir = name == "video_root"
        if os.path.isdir(path) if want_dir else os.path.isfile(path):
            continue
        where = (
            ""
            if os.path.isabs(path)
            else f" (relative paths are resolved from the current directory, {os.getcwd()})"
        )
        what = "directory" if want_dir else "file"
        problems.append(
            f"{name}: {path!r}, set in {config}, is not an existing {what}{where}. Fix {name} in the "
            f"recipe to point at the {what}"
            + (", or remove it if the annotations carry durations." if name == "durations_file" else ".")
        )
    return problems


def check_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m video_grpo.data check", description="Validate annotations and videos before training."
    )
    parser.add_argument("--config", help="a GRPO recipe YAML; its train_file, video_root, ... are used")
    parser.add_argument(
        "--split", choices=["train", "eval"], default="train", help="with --config: which file"
    )
    parser.add_argument("--annotations", help="annotation file (instead of --config)")
    parser.add_argument("--video_root")
    parser.add_argument(
        "--durations",
        help="CSV with 'id' and 'length' columns: the Charades CSV (for .txt annotations), or one for "
        "timelens2_93k (else its videos' lengths are read from the videos)",
    )
    parser.add_argument("--format", dest="dataset_format")
    parser.add_argument("--strict", action="store_true", help="treat policy violations as errors")
    parser.add_argument(
        "--allow_absolute_video_paths", action="store_true", help="accept video paths outside --video_root"
    )
    parser.add_argument(
        "--decode", action="store_true", help="decode every video's sampled frames, not only headers"
    )
    parser.add_argument(
        "--model_family",
        choices=sorted(FAMILIES),
        help="frame geometry for --decode; default: the recipe model's family (--config), else qwen2_5_vl",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    parser.add_argument(
        "--write_durations",
        metavar="CSV",
        help="also write each readable video's length (frames / fps) as id,length rows, id its path under the "
        "video root without extension: a durations_file for timelens2_93k, which then reads no header at start",
    )
    args = parser.parse_args(argv)
    if bool(args.config) == bool(args.annotations):
        parser.error("give exactly one of --config or --annotations")

    if args.config:
        from video_grpo.configs import script_args_from_yaml

        try:
            script_args = script_args_from_yaml(args.config)
        except ValueError as err:
            print(f"error: {args.config}: {err}", file=sys.stderr)
            return 2
        if args.split == "train" and script_args.train_sources:
            if args.write_durations:
                parser.error(
                    "--write_durations reads one annotation file; with train_sources, run it with --annotations "
                    "and --video_root of the source that needs durations"
                )
            return check_sources_main(args, script_args)
        annotations = script_args.train_file if args.split == "train" else script_args.eval_file
        if not annotations:
            parser.error(f"{args.config} sets no {args.split}_file")
        problems = missing_recipe_paths(
            script_args, args.config, (f"{args.split}_file", "durations_file", "video_root")
        )
        if problems:
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            return 2
        family = family_of_recipe(args.config, args.model_family) if args.decode else FAMILIES["qwen2_5_vl"]
        kwargs = dataset_kwargs(script_args, family)
        sampling = kwargs["sampling"]
        load_kwargs = {
            k: kwargs[k]
            for k in (
                "video_root",
                "dataset_format",
                "durations_file",
                "video_extensions",
                "allow_absolute_video_paths",
            )
        }
        strict = args.strict or script_args.strict_data
    else:
        family = FAMILIES[args.model_family or "qwen2_5_vl"]
        annotations, strict = args.annotations, args.strict
        if args.durations and not Path(args.durations).is_file():
            print(
                f"error: --durations: {args.durations!r} is not an existing file; pass the Charades CSV with the "
                "'length' column (Charades_v1_train.csv / Charades_v1_test.csv).",
                file=sys.stderr,
            )
            return 2
        sampling = SamplingConfig(size_multiple=family.size_multiple, temporal_patch=family.temporal_patch)
        load_kwargs = {
            "video_root": args.video_root,
            "dataset_format": args.dataset_format,
            "durations_file": args.durations,
            "allow_absolute_video_paths": args.allow_absolute_video_paths,
        }
    try:
        records, report = load_annotations(annotations, strict=strict, **load_kwargs)
    except (AnnotationError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    videos = sorted({r["video"] for r in records})
    lengths: dict[str, float] | None = {} if args.write_durations else None
    check_videos(report, videos, sampling if args.decode else None, quiet=args.json, lengths=lengths)
    if lengths is not None:
        root = load_kwargs["video_root"] or Path(annotations).parent
        write_durations(args.write_durations, lengths, Path(root).resolve())
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(format_summary(annotations, report, args.decode))
    return 0 if report.can_train else 1


def check_sources_main(args: argparse.Namespace, script_args) -> int:
    """``data check --config`` for a recipe with ``train_sources``: each source loaded and its videos checked on its
    own, a summary (or a JSON object) per source, every error naming the source. Exit codes as for one file."""
    from video_grpo.sources import missing_source_paths

    sources = recipe_sources(script_args)
    problems = missing_source_paths(sources)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    family = family_of_recipe(args.config, args.model_family) if args.decode else FAMILIES["qwen2_5_vl"]
    sampling = SamplingConfig.from_args(script_args, family) if args.decode else None
    strict = args.strict or script_args.strict_data
    checked = []
    for source in sources:
        try:
            records, report = load_source(
                source, tuple(script_args.video_extensions), strict, script_args.allow_absolute_video_paths
            )
        except (AnnotationError, FileNotFoundError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        check_videos(report, sorted({r["video"] for r in records}), sampling, quiet=args.json)
        checked.append((source, report))
    can_train = all(report.can_train for _, report in checked)
    if args.json:
        print(
            json.dumps(
                {
                    "sources": {
                        source.name: {
                            "annotations": source.train_file,
                            "can_train": report.can_train,
                            **report.as_dict(),
                        }
                        for source, report in checked
                    },
                    "records": sum(report.records for _, report in checked),
                    "can_train": can_train,
                }
            )
        )
    else:
        for source, report in checked:
            print(f"== source {source.name} ==")
            print(format_summary(source.train_file, report, args.decode))
            print()
        not_ready = [source.name for source, report in checked if not report.can_train]
        total = sum(report.records for _, report in checked)
        print(
            f"all sources: {total} usable queries in {len(checked)} sources; "
            + ("OK: the data can train." if can_train else f"NOT READY: fix the sources {not_ready} above.")
        )
    return 0 if can_train else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m video_grpo.data check [--config C | --annotations A ...] [--decode] [--json]"
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{usage}\n\n`check --help` lists every option.")
        return 0
    if not argv or argv[0] != "check":
        print(usage, file=sys.stderr)
        return 2
    return check_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
