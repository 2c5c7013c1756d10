"""``python -m video_grpo.data check``: annotations and videos checked before GPU hours are spent on them.

It exits with status 1 when the data could not train (no usable query, or a missing or unreadable video) and 2
when the annotations themselves are malformed. A recipe with ``train_sources`` has each source checked and
reported on its own, and every error names its source. This is a command: it reads the recipe with
:mod:`video_grpo.configs`, which the rest of the data package never imports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from video_grpo.data.annotations import AnnotationError, DataReport, load_annotations
from video_grpo.data.dataset import dataset_kwargs
from video_grpo.data.sources import load_source, recipe_sources
from video_grpo.data.video import SamplingConfig, VideoReadError, probe_video, read_video
from video_grpo.inputs.families import FAMILIES, family_of_recipe


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
    from video_grpo.data.sources import missing_source_paths

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
