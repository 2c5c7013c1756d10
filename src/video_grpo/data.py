"""Grounding datasets: read annotations, build a ``datasets.Dataset``, and decode video lazily per access.

The annotation format is JSONL, one query per line::

    {"id": "3MSZA_0", "video": "3MSZA.mp4", "duration": 30.96, "solution": [24.3, 30.4], "sentence": "person turn a light on."}

``video`` is resolved against ``video_root`` (default: the annotation file's directory).

Frames are decoded when a row is *accessed*, through ``Dataset.set_transform``: it applies to ``ds[i]``,
``ds[[i, j]]``, DataLoader batches of any size, and it survives ``.shuffle()`` and ``.select()``. Within one
access, a video repeated across rows (GRPO repeats each prompt G times) is decoded once and shared.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from datasets import Dataset

from video_grpo.configs import DEFAULT_PROMPT
from video_grpo.video import SamplingConfig, read_video

REQUIRED_FIELDS = ("id", "video", "duration", "solution", "sentence")


class AnnotationError(ValueError):
    """A malformed annotation record. The message names the file and line."""


def _check_record(record: dict, where: str) -> dict:
    missing = [k for k in REQUIRED_FIELDS if k not in record]
    if missing:
        raise AnnotationError(f"{where}: missing field(s) {missing}; each line needs {list(REQUIRED_FIELDS)}")
    solution = record["solution"]
    if not (isinstance(solution, list | tuple) and len(solution) == 2):
        raise AnnotationError(f"{where}: 'solution' must be [start, end] in seconds, got {solution!r}")
    try:
        start, end, duration = float(solution[0]), float(solution[1]), float(record["duration"])
    except (TypeError, ValueError) as err:
        raise AnnotationError(f"{where}: 'solution' and 'duration' must be numbers ({err})") from err
    if not all(math.isfinite(v) for v in (start, end, duration)) or duration <= 0:
        raise AnnotationError(f"{where}: 'duration' must be > 0 and spans finite, got {duration}, {solution!r}")
    if not 0 <= start < end:
        raise AnnotationError(f"{where}: 'solution' needs 0 <= start < end, got {solution!r}")
    return {
        "id": str(record["id"]),
        "video": str(record["video"]),
        "duration": duration,
        "solution": [start, end],
        "sentence": str(record["sentence"]).strip(),
    }


def read_jsonl(path: str | Path) -> list[dict]:
    """Read and validate a canonical JSONL annotation file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"annotation file {str(path)!r} does not exist")
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise AnnotationError(f"{where}: not valid JSON ({err.msg})") from err
            if not isinstance(record, dict):
                raise AnnotationError(f"{where}: expected a JSON object, got {type(record).__name__}")
            records.append(_check_record(record, where))
    if not records:
        raise AnnotationError(f"{path}: no records")
    return records


def build_prompt(sentence: str, duration: float, template: str = DEFAULT_PROMPT) -> list[dict]:
    """The conversational prompt: the video first, then the instruction."""
    text = template.replace("{sentence}", sentence).replace("{duration}", f"{duration:.2f}")
    return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]


class VideoTransform:
    """``set_transform`` callable: adds ``prompt``, ``video_frames`` and ``video_metadata`` to each row.

    A plain class (not a closure) so the dataset pickles into DataLoader worker processes.
    """

    def __init__(self, sampling: SamplingConfig, prompt_template: str = DEFAULT_PROMPT) -> None:
        self.sampling = sampling
        self.prompt_template = prompt_template

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        decoded = {}
        for path in batch["video"]:
            if path not in decoded:  # the G repeats of a prompt share one decode
                decoded[path] = read_video(path, self.sampling)
        batch = dict(batch)
        batch["video_frames"] = [decoded[p].frames for p in batch["video"]]
        batch["video_metadata"] = [decoded[p].metadata for p in batch["video"]]
        batch["prompt"] = [
            build_prompt(s, d, self.prompt_template) for s, d in zip(batch["sentence"], batch["duration"], strict=True)
        ]
        return batch


def build_dataset(
    annotation_file: str | Path,
    video_root: str | Path | None = None,
    sampling: SamplingConfig | None = None,
    prompt_template: str = DEFAULT_PROMPT,
    max_samples: int | None = None,
) -> Dataset:
    """A ``Dataset`` whose rows decode their video on access. Video paths are made absolute here."""
    records = read_jsonl(annotation_file)
    if max_samples is not None:
        records = records[:max_samples]
    root = Path(video_root) if video_root else Path(annotation_file).resolve().parent
    for record in records:
        record["video"] = str((root / record["video"]).resolve())
    dataset = Dataset.from_list(records)
    dataset.set_transform(VideoTransform(sampling or SamplingConfig(), prompt_template))
    return dataset


def build_datasets(script_args) -> tuple[Dataset, Dataset | None]:
    """Train and (optional) eval datasets from ``GRPOScriptArguments``."""
    sampling = SamplingConfig.from_args(script_args)
    kwargs = {"video_root": script_args.video_root, "sampling": sampling, "prompt_template": script_args.prompt_template}
    train = build_dataset(script_args.train_file, max_samples=script_args.max_train_samples, **kwargs)
    evaluation = build_dataset(script_args.eval_file, **kwargs) if script_args.eval_file else None
    return train, evaluation
