"""Decode every video of a recipe once and store its sampled frames, so training reads instead of decoding.

    python -m video_grpo.preprocess --config configs/grpo/qwen2_5_vl_7b_charades.yaml [--num_workers 8] [--dry_run]

Frames go to ``frame_cache_dir`` (set it in the recipe, or pass ``--frame_cache_dir``) in
``frame_cache_format`` (``jpeg`` by default, ``raw`` for exact frames; see :mod:`video_grpo.data.frame_cache`). An
entry is keyed by the video's path, size and mtime and by every sampling setting, so changing ``video_fps`` or
a pixel limit never reuses stale frames. Entries are written to a temporary file and renamed, so a killed run
leaves no half-written entry; rerunning skips what is already there.

Before it starts, it prints what the cache will take: a few videos spread over the list are sampled and
encoded in memory, and their size per frame is scaled to every video's frame count (from the annotated
durations and the sampling settings). ``--dry_run`` prints that and stops. At the end it prints the real total.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from multiprocessing import Pool

from tqdm.auto import tqdm

from video_grpo.configs import script_args_from_yaml
from video_grpo.data.frame_cache import cache_path, entry_size, write_cache
from video_grpo.data.video import SamplingConfig, VideoReadError, plan_sampling, read_video
from video_grpo.inputs.families import FAMILIES, family_of_recipe


def _cache_one(job: tuple[str, SamplingConfig, str, str]) -> tuple[str, str | None]:
    path, sampling, cache_dir, fmt = job
    try:
        if not cache_path(cache_dir, path, sampling, fmt).is_file():
            write_cache(cache_dir, path, sampling, read_video(path, sampling), fmt)
        return path, None
    except (VideoReadError, OSError) as err:
        return path, str(err)


def preprocess(
    videos: list[str],
    sampling: SamplingConfig,
    cache_dir: str,
    num_workers: int = 1,
    quiet: bool = False,
    fmt: str = "jpeg",
) -> dict[str, str]:
    """Cache every video in format ``fmt``; returns ``{path: error}`` for the ones that failed."""
    jobs = [(video, sampling, cache_dir, fmt) for video in videos]
    failures = {}
    progress = tqdm(total=len(jobs), desc="caching frames", unit="video", disable=quiet)
    if num_workers > 1:
        with Pool(num_workers) as pool:
            for path, error in pool.imap_unordered(_cache_one, jobs, chunksize=4):
                progress.update()
                if error:
                    failures[path] = error
    else:
        for job in jobs:
            path, error = _cache_one(job)
            progress.update()
            if error:
                failures[path] = error
    progress.close()
    return failures


@dataclass
class SizeEstimate:
    """What a cache of ``videos`` videos should take, from ``sampled`` of them decoded and encoded in memory."""

    total_bytes: int
    videos: int
    sampled: int
    frames: int  # frames over all videos, from the annotated durations and the sampling settings
    bytes_per_frame: float


def estimate_size(
    durations: dict[str, float], sampling: SamplingConfig, fmt: str, samples: int = 5
) -> SizeEstimate:
    """Bytes the cache of these videos (path -> annotated duration) will take in format ``fmt``.

    Decodes and encodes ``samples`` videos spread over the sorted list, measures their entries' bytes per frame
    and frame size, and applies them to every video's frame count as :func:`plan_sampling` would choose it for
    that duration. Assumes the sampled videos' resolution is typical (a dataset of one source usually is).
    Unreadable samples are skipped; with none readable, raises :class:`VideoReadError` for the last one."""
    videos = sorted(durations)
    if not videos:
        return SizeEstimate(0, 0, 0, 0, 0.0)
    step = max(1, len(videos) // samples)
    picked = videos[::step][:samples]
    sizes, frames, shapes, error = [], [], [], None
    for path in picked:
        try:
            video = read_video(path, sampling)
        except VideoReadError as err:
            error = err
            continue
        sizes.append(entry_size(video, fmt))
        frames.append(video.frames.shape[0])
        shapes.append((video.metadata["height"], video.metadata["width"]))
    if not sizes:
        raise error
    bytes_per_frame = sum(sizes) / sum(frames)
    height, width = sorted(shapes)[len(shapes) // 2]
    counts = [plan_sampling(durations[v], height, width, sampling)[0] for v in videos]
    return SizeEstimate(
        round(bytes_per_frame * sum(counts)), len(videos), len(sizes), sum(counts), bytes_per_frame
    )


def cache_bytes(videos: list[str], sampling: SamplingConfig, cache_dir: str, fmt: str) -> tuple[int, int]:
    """``(bytes, entries)`` of the entries these videos have in the cache, in format ``fmt``."""
    total = entries = 0
    for video in videos:
        try:
            total += os.path.getsize(cache_path(cache_dir, video, sampling, fmt))
            entries += 1
        except OSError:
            pass  # no entry (a failed video), or no video
    return total, entries


def human_bytes(n: float) -> str:
    """Decimal units, as disks are sold: 1 GB = 10^9 bytes."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--frame_cache_dir", help="overrides the recipe's frame_cache_dir")
    parser.add_argument(
        "--frame_cache_format", choices=["jpeg", "raw"], help="overrides the recipe's frame_cache_format"
    )
    parser.add_argument("--num_workers", type=int, default=1)
    parser.add_argument(
        "--model_family",
        choices=sorted(FAMILIES),
        help="frame geometry to cache for; default: the family of the recipe's model_name_or_path",
    )
    parser.add_argument(
        "--estimate_samples",
        type=int,
        default=5,
        help="videos decoded to estimate the cache's size before starting",
    )
    parser.add_argument("--dry_run", action="store_true", help="print the estimated size and exit")
    args = parser.parse_args(argv)
    script_args = script_args_from_yaml(
        args.config, frame_cache_dir=args.frame_cache_dir, frame_cache_format=args.frame_cache_format
    )
    if not script_args.frame_cache_dir and not args.dry_run:
        parser.error("no frame_cache_dir: set it in the recipe or pass --frame_cache_dir")
    from video_grpo.data.check import missing_recipe_paths
    from video_grpo.data.sources import eval_source, load_source, missing_source_paths, recipe_sources

    problems = missing_recipe_paths(
        script_args, args.config, ("train_file", "eval_file", "durations_file", "video_root")
    )
    sources = recipe_sources(script_args) if script_args.train_file or script_args.train_sources else []
    if script_args.train_sources:
        problems += missing_source_paths(sources)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    if script_args.eval_file:  # read as its own file, with the recipe's top-level settings
        sources.append(eval_source(script_args))
    durations = {}
    for source in sources:  # every training source (train_sources, or train_file) and the eval file
        records, _ = load_source(
            source,
            tuple(script_args.video_extensions),
            allow_absolute_video_paths=script_args.allow_absolute_video_paths,
        )
        durations.update((r["video"], float(r["duration"])) for r in records)
    videos = sorted(durations)
    fmt = script_args.frame_cache_format
    sampling = SamplingConfig.from_args(script_args, family_of_recipe(args.config, args.model_family))
    try:
        estimate = estimate_size(durations, sampling, fmt, args.estimate_samples)
    except VideoReadError as err:
        print(
            f"error: none of the videos sampled for the size estimate could be read; last: {err}",
            file=sys.stderr,
        )
        return 1
    print(
        f"estimated cache size: {human_bytes(estimate.total_bytes)} ({estimate.total_bytes} bytes) for "
        f"{estimate.videos} videos, {estimate.frames} frames, as {fmt} (from {estimate.sampled} sampled videos, "
        f"{human_bytes(estimate.bytes_per_frame)} per frame)",
        flush=True,
    )
    if args.dry_run:
        return 0
    failures = preprocess(videos, sampling, script_args.frame_cache_dir, args.num_workers, fmt=fmt)
    total, entries = cache_bytes(videos, sampling, script_args.frame_cache_dir, fmt)
    print(f"cached {len(videos) - len(failures)} of {len(videos)} videos in {script_args.frame_cache_dir}")
    print(f"cache size: {human_bytes(total)} ({total} bytes) in {entries} {fmt} entries")
    for error in sorted(failures.values()):
        print(f"  failed: {error}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
