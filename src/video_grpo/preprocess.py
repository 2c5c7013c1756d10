"""Decode every video of a recipe once and store its sampled frames, so training reads instead of decoding.

    python -m video_grpo.preprocess --config configs/grpo/qwen2_5_vl_7b_charades.yaml [--num_workers 8]

Frames go to ``frame_cache_dir`` (set it in the recipe, or pass ``--frame_cache_dir``). An entry is keyed by
the video's path, size and mtime and by every sampling setting, so changing ``video_fps`` or a pixel limit
never reuses stale frames. Entries are written to a temporary file and renamed, so a killed run leaves no
half-written entry; rerunning skips what is already there.
"""

from __future__ import annotations

import argparse
import sys
from multiprocessing import Pool

from tqdm.auto import tqdm

from video_grpo.annotations import load_annotations
from video_grpo.configs import script_args_from_yaml
from video_grpo.families import FAMILIES, family_of_recipe
from video_grpo.video import SamplingConfig, VideoReadError, cache_path, read_video, write_cache


def _cache_one(job: tuple[str, SamplingConfig, str]) -> tuple[str, str | None]:
    path, sampling, cache_dir = job
    try:
        if not cache_path(cache_dir, path, sampling).is_file():
            write_cache(cache_dir, path, sampling, read_video(path, sampling))
        return path, None
    except (VideoReadError, OSError) as err:
        return path, str(err)


def preprocess(videos: list[str], sampling: SamplingConfig, cache_dir: str, num_workers: int = 1,
               quiet: bool = False) -> dict[str, str]:
    """Cache every video; returns ``{path: error}`` for the ones that failed."""
    jobs = [(video, sampling, cache_dir) for video in videos]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--frame_cache_dir", help="overrides the recipe's frame_cache_dir")
    parser.add_argument("--num_workers", type=int, default=1)
    parser.add_argument("--model_family", choices=sorted(FAMILIES),
                        help="frame geometry to cache for; default: the family of the recipe's model_name_or_path")
    args = parser.parse_args(argv)
    script_args = script_args_from_yaml(args.config, frame_cache_dir=args.frame_cache_dir)
    if not script_args.frame_cache_dir:
        parser.error("no frame_cache_dir: set it in the recipe or pass --frame_cache_dir")
    videos = set()
    for annotation_file in (script_args.train_file, script_args.eval_file):
        if annotation_file:
            records, _ = load_annotations(annotation_file, script_args.dataset_format, script_args.video_root,
                                          script_args.durations_file, tuple(script_args.video_extensions),
                                          allow_absolute_video_paths=script_args.allow_absolute_video_paths)
            videos.update(r["video"] for r in records)
    sampling = SamplingConfig.from_args(script_args, family_of_recipe(args.config, args.model_family))
    failures = preprocess(sorted(videos), sampling, script_args.frame_cache_dir, args.num_workers)
    print(f"cached {len(videos) - len(failures)} of {len(videos)} videos in {script_args.frame_cache_dir}")
    for error in sorted(failures.values()):
        print(f"  failed: {error}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
