"""Several annotation sources in one training run, each read with its own loader, files and prompt.

TimeLens2 trains GRPO on TimeLens2-93K and TimeLens-100K together, each with its own annotation file, media root and
prompt template (MCG-NJU/TimeLens2 ``grpo/configs/data/timelens2.json``, read by ``grpo/timelens/data/sources.py``).
A recipe declares the same as a mapping, in place of ``train_file``::

    train_sources:
      timelens2-93k:
        train_file: data/TimeLens2-93K/TimeLens2-93K_raw_annotations.jsonl
        dataset_format: timelens2_93k
        video_root: data/TimeLens2-93K/videos
        durations_file: data/TimeLens2-93K/durations.csv
        prompt_template: "Query: '{sentence}' ..."
        normalize_query: true
      timelens-100k:
        train_file: data/TimeLens-100K/timelens-100k.jsonl
        video_root: data/TimeLens-100K/videos
        prompt_template: "Please find the visual event described by the sentence '{sentence}' ..."

A source takes the keys of :data:`SOURCE_KEYS`; ``train_file`` is required. A key left out takes the recipe's
top-level field of the same name (``dataset_format`` is then detected from the file when that is unset too); a key
given as null means none, so a source can go without the recipe's ``durations_file``. ``normalize_query`` folds
whitespace runs and drops trailing periods of each query, as TimeLens2 does before it substitutes a query into a
template (``grpo/timelens/data/prompt.py``); the ``timelens_100k`` and ``timelens_bench`` loaders already do it.

The training rows are every source's rows in the order the sources are declared (``max_train_samples`` keeps the
first N of them). Each row's ``id`` is ``<source>/<id in its file>``, so ids stay unique across sources and do not
change when a source is added; curate and evaluate read a recipe's sources through this same loader, so curate's
``per_query.jsonl`` carries these ids and the draw weights line up with the rows. A ``data_source`` column names
each row's source, and its prompt is written with that source's template. A dataset column holds one type: when
any source has a multi-span query, every row's ``solution`` is a list of spans (``[[s, e]]`` for one).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from video_grpo.data.annotations import AnnotationError, DataReport, load_annotations
from video_grpo.data.timelens_annotations import timelens_query

SOURCE_KEYS = (
    "train_file",
    "dataset_format",
    "video_root",
    "durations_file",
    "prompt_template",
    "normalize_query",
)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # no '/': it separates the source from the id


@dataclass(frozen=True)
class DataSource:
    """One annotation source with every setting resolved. ``name`` is None for a recipe's plain ``train_file``."""

    name: str | None
    train_file: str
    dataset_format: str | None
    video_root: str | None
    durations_file: str | None
    prompt_template: str
    normalize_query: bool = False

    def describe(self) -> str:
        """How errors name it: the recipe field and the file."""
        if self.name is None:
            return f"train_file {self.train_file}"
        return f"train_sources.{self.name} ({self.train_file})"

    def field(self, key: str) -> str:
        """The recipe field that sets ``key`` for this source, for the fix an error names."""
        return key if self.name is None else f"train_sources.{self.name}.{key}"


def parse_train_sources(value) -> dict[str, dict] | None:
    """``train_sources`` as a mapping ``name -> {key: value}``, checked: a JSON string (the command line) is read;
    every error names the source and the key, and what to write instead."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"train_sources: is not valid JSON ({err.msg}): {value!r}") from None
    if not isinstance(value, dict) or not value:
        raise ValueError(
            "train_sources: must be a non-empty mapping of source name to its settings, e.g. "
            "{timelens-100k: {train_file: ..., video_root: ...}}"
        )
    from video_grpo.data.annotations import FORMATS

    sources = {}
    for name, settings in value.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise ValueError(
                f"train_sources: source name {name!r} must be letters, digits, '_', '.' or '-' (no '/', which "
                "separates the source from the query id)"
            )
        where = f"train_sources.{name}"
        if not isinstance(settings, dict):
            raise ValueError(f"{where}: must be a mapping of {list(SOURCE_KEYS)}, got {settings!r}")
        unknown = [key for key in settings if key not in SOURCE_KEYS]
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: unknown key; a source takes {list(SOURCE_KEYS)}")
        if not settings.get("train_file"):
            raise ValueError(f"{where}.train_file: not set; every source needs its annotation file")
        for key in ("train_file", "dataset_format", "video_root", "durations_file", "prompt_template"):
            if settings.get(key) is not None and not isinstance(settings[key], str):
                raise ValueError(f"{where}.{key}: must be a string, got {settings[key]!r}")
        fmt = settings.get("dataset_format")
        if fmt is not None and fmt not in FORMATS:
            raise ValueError(
                f"{where}.dataset_format: unknown format {fmt!r}; choose one of {list(FORMATS)} or leave it out"
            )
        template = settings.get("prompt_template")
        if template is not None and "{sentence}" not in template:
            hint = (
                " (TimeLens2's templates write it {query}: rename it {sentence})"
                if "{query}" in template
                else ""
            )
            raise ValueError(
                f"{where}.prompt_template: must contain '{{sentence}}' where the query goes{hint}"
            )
        if settings.get("normalize_query") is not None and not isinstance(settings["normalize_query"], bool):
            raise ValueError(
                f"{where}.normalize_query: must be true or false, got {settings['normalize_query']!r}"
            )
        sources[name] = dict(settings)
    return sources


def _top_level(script_args) -> dict:
    return {
        "dataset_format": script_args.dataset_format,
        "video_root": script_args.video_root,
        "durations_file": script_args.durations_file,
        "prompt_template": script_args.prompt_template,
        "normalize_query": bool(getattr(script_args, "normalize_query", False)),
    }


def eval_source(script_args) -> DataSource:
    """A recipe's ``eval_file`` as an unnamed source, read with the recipe's top-level settings."""
    return DataSource(None, script_args.eval_file, **_top_level(script_args))


def recipe_sources(script_args) -> list[DataSource]:
    """The training sources of a recipe (its parsed script arguments): each of ``train_sources`` with the
    top-level fields filled in where it leaves a key out, or the one unnamed source of ``train_file``."""
    top = _top_level(script_args)
    if not script_args.train_sources:
        return [DataSource(None, script_args.train_file, **top)]
    sources = []
    for name, settings in script_args.train_sources.items():
        values = {key: settings.get(key, default) for key, default in top.items()}
        values["prompt_template"] = values["prompt_template"] or top["prompt_template"]
        values["normalize_query"] = bool(values["normalize_query"])
        sources.append(DataSource(name, settings["train_file"], **values))
    return sources


def prompt_templates(
    train_sources: dict | None, prompt_template: str, eval_file: str | None = None
) -> list[str]:
    """Every prompt template a recipe writes: each source's, and the top-level one where it applies (a source that
    leaves it out, the eval file, or a recipe without sources). The planner sizes the prompt by the longest."""
    if not train_sources:
        return [prompt_template]
    templates = [settings.get("prompt_template") or prompt_template for settings in train_sources.values()]
    if eval_file:
        templates.append(prompt_template)
    return list(dict.fromkeys(templates))


def load_source(
    source: DataSource,
    video_extensions: tuple[str, ...],
    strict: bool = False,
    allow_absolute_video_paths: bool = False,
) -> tuple[list[dict], DataReport]:
    """One source's records (``load_annotations``), its queries normalised if asked; errors name a named source."""
    try:
        records, report = load_annotations(
            source.train_file,
            source.dataset_format,
            source.video_root,
            source.durations_file,
            tuple(video_extensions),
            strict,
            allow_absolute_video_paths,
        )
    except (AnnotationError, FileNotFoundError) as err:
        if source.name is None:  # a plain file (train or eval): its errors already name it
            raise
        raise type(err)(f"{source.describe()}: {err}") from None
    if source.normalize_query:
        for record in records:
            record["sentence"] = timelens_query(record["sentence"])
    return records, report


def load_sources(
    sources: list[DataSource],
    video_extensions: tuple[str, ...],
    strict: bool = False,
    allow_absolute_video_paths: bool = False,
) -> tuple[list[dict], list[tuple[DataSource, DataReport]]]:
    """Every named source's records in order, ids ``<source>/<id>``, a ``data_source`` column, one solution shape
    (lists of spans for all when any source has a multi-span query). Each source's report comes back beside it."""
    records, reports = [], []
    for source in sources:
        rows, report = load_source(source, video_extensions, strict, allow_absolute_video_paths)
        for row in rows:
            row["id"] = f"{source.name}/{row['id']}"
            row["data_source"] = source.name
        records.extend(rows)
        reports.append((source, report))
    if any(_several_spans_shape(r["solution"]) for r in records):
        for record in records:
            if not _several_spans_shape(record["solution"]):
                record["solution"], record["solution_raw"] = [record["solution"]], [record["solution_raw"]]
    seen: dict[str, str] = {}
    for record in records:
        if record["id"] in seen:
            raise AnnotationError(
                f"train_sources.{record['data_source']}: query id {record['id']!r} appears twice; each query of a "
                "source needs its own id"
            )
        seen[record["id"]] = record["data_source"]
    return records, reports


def _several_spans_shape(solution) -> bool:
    return bool(solution) and isinstance(solution[0], list | tuple)


def source_paths(source: DataSource) -> list[tuple[str, str, bool]]:
    """``(field, path, is_directory)`` for each path a source sets, the field as a recipe names it."""
    paths = [(source.field("train_file"), source.train_file, False)]
    if source.durations_file:
        paths.append((source.field("durations_file"), source.durations_file, False))
    if source.video_root:
        paths.append((source.field("video_root"), source.video_root, True))
    return paths


def missing_source_paths(sources: list[DataSource]) -> list[str]:
    """One message per source path that names no file (no directory, for ``video_root``), naming the field."""
    problems = []
    for source in sources:
        for field, path, is_dir in source_paths(source):
            exists = Path(path).is_dir() if is_dir else Path(path).is_file()
            if not exists:
                what = "directory" if is_dir else "file"
                problems.append(f"{field}: {path!r} is not an existing {what}; fix {field} in the recipe.")
    return problems
