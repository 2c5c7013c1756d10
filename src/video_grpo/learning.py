"""Does it learn? Cold-start SFT, then GRPO, on a synthetic grounding task, on CPU.

Run through ``python -m video_grpo.bench learning`` (about 2 minutes on 2 cores; ``make test`` runs it too). The task (``video_grpo.synthetic``): videos
of 10-40 s in which a shape of the named colour moves across the frame between S and E; train and test
splits use different videos. A tiny Qwen2.5-VL is first taught the answer format by SFT, then trained by
GRPO with the ``iou`` and ``format`` rewards. The SFT targets carry *random* spans: SFT teaches the format
only, so whatever the model learns about where events are comes from GRPO (with the annotated spans, SFT
alone already taught the tiny model the best fixed span, and GRPO had nothing left to add).
Reported (JSON lines, the benchmark schema):

- ``learning_iou``: mean IoU reward over the last 20% of GRPO steps (ours) vs the first 20% (baseline);
- ``test_iou_before_after``: test-split mIoU (greedy) of the GRPO model vs the SFT model;
- ``format_rate``: share of test answers in the exact format, after vs before GRPO;
- ``uses_video``: test mIoU of the GRPO model with the real frames (ours) vs the same model on the same
  queries with every frame blacked out (baseline). Equal numbers mean its answers do not depend on the
  frames: it learned a prior over spans, not to look.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import torch

from video_grpo.video import SamplingConfig

GRPO_LEARNING_RATE = 1e-4
GRPO_TEMPERATURE = 0.7
SAMPLING = SamplingConfig(fps=1.0, min_frames=4, max_frames=16, min_pixels=3136, max_pixels=112 * 112, max_tokens=128)


def _answers(model_dir: Path, dataset, batch_size: int = 8) -> list[dict]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from video_grpo.evaluate import generate_answers, prediction_record

    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    records = []
    for start in range(0, len(dataset), batch_size):
        rows = dataset.__getitems__(list(range(start, min(len(dataset), start + batch_size))))
        outputs = generate_answers(model, processor, rows, max_new_tokens=48)
        records += [prediction_record(row, out) for row, out in zip(rows, outputs, strict=True)]
    return records


def _test_metrics(model_dir: Path, dataset) -> tuple[float, float]:
    from video_grpo.evaluate import score_records
    from video_grpo.rewards import format_reward

    records = _answers(model_dir, dataset)
    metrics = score_records(records)
    formats = format_reward(completions=[r["output"] for r in records])
    return metrics["mIoU"], 100.0 * sum(formats) / len(formats)


def _sft(model_dir: Path, dataset, out: Path, steps: int) -> Path:
    from transformers import AutoProcessor
    from trl import SFTConfig, SFTTrainer

    from video_grpo.families import QWEN2_5_VL
    from video_grpo.sft import SFTScriptArguments, VideoSFTCollator

    processor = AutoProcessor.from_pretrained(model_dir)
    args = SFTConfig(output_dir=str(out), max_steps=steps, per_device_train_batch_size=8, learning_rate=3e-3,
                     lr_scheduler_type="constant", bf16=False, use_cpu=True, gradient_checkpointing=False,
                     report_to="none", save_strategy="no", logging_steps=10, seed=0, remove_unused_columns=False,
                     dataset_kwargs={"skip_prepare_dataset": True}, disable_tqdm=True)
    template = SFTScriptArguments.__dataclass_fields__["answer_template"].default
    trainer = SFTTrainer(model=str(model_dir), args=args, train_dataset=dataset,
                         data_collator=VideoSFTCollator(processor, template, QWEN2_5_VL), processing_class=processor)
    trainer.train()
    trainer.save_model(str(out))
    processor.save_pretrained(str(out))
    return out


def _grpo(model_dir: Path, dataset, out: Path, steps: int) -> list[dict]:
    from transformers import AutoProcessor
    from trl import GRPOConfig

    from video_grpo.rewards import format_reward, iou_reward
    from video_grpo.trainer import VideoGRPOTrainer

    args = GRPOConfig(output_dir=str(out), max_steps=steps, per_device_train_batch_size=16, num_generations=8,
                      max_completion_length=48, temperature=GRPO_TEMPERATURE, learning_rate=GRPO_LEARNING_RATE, lr_scheduler_type="constant",
                      beta=0.0, loss_type="grpo", bf16=False, use_cpu=True, gradient_checkpointing=False,
                      report_to="none", save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True)
    trainer = VideoGRPOTrainer(model=str(model_dir), reward_funcs=[iou_reward, format_reward], args=args,
                               train_dataset=dataset, processing_class=AutoProcessor.from_pretrained(model_dir))
    trainer.train()
    trainer.save_model(str(out))
    trainer.processing_class.save_pretrained(str(out))
    return [e for e in trainer.state.log_history if "rewards/iou_reward/mean" in e]


def plot_learning(history: list[dict], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [e["step"] for e in history]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for key, label in (("rewards/iou_reward/mean", "IoU reward"), ("rewards/format_reward/mean", "format reward")):
        ax.plot(steps, [float(e[key]) for e in history], marker=".", label=label)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def _random_spans(source: Path, target: Path, seed: int = 0) -> Path:
    """A copy of the annotations whose spans are random: SFT on it teaches the answer format, not the spans."""
    import random

    rng = random.Random(seed)
    lines = []
    for line in source.read_text().splitlines():
        record = json.loads(line)
        a, b = sorted(rng.uniform(0, record["duration"]) for _ in range(2))
        record["solution"] = [round(a, 1), round(max(b, a + 0.5), 1)]
        lines.append(json.dumps(record))
    target.write_text("\n".join(lines) + "\n")
    return target


class BlankFrames:
    """Wraps a dataset transform and blacks out every frame: same prompts, same timing, nothing to see."""

    def __init__(self, transform) -> None:
        self.transform = transform

    def __call__(self, batch):
        batch = self.transform(batch)
        batch["video_frames"] = [torch.zeros_like(f) for f in batch["video_frames"]]
        return batch


def _blank(dataset):
    from video_grpo.data import VideoTransform

    dataset = dataset.with_format(None)
    dataset.set_transform(BlankFrames(VideoTransform(SAMPLING, records=None)))
    return dataset


def run(work: Path, emit, plot_to: Path | None = None) -> dict:
    from video_grpo.data import build_dataset
    from video_grpo.synthetic import make_split
    from video_grpo.tiny import build_tiny_model

    started = time.perf_counter()
    data = work / "task"
    make_split(data, "train", 96, seed=10, min_dur=10, max_dur=40)
    make_split(data, "test", 32, seed=11, min_dur=10, max_dur=40)
    sft_steps, grpo_steps = 80, 80
    train = build_dataset(data / "train.jsonl", sampling=SAMPLING)
    format_only = _random_spans(data / "train.jsonl", data / "train_random_spans.jsonl")
    test = build_dataset(data / "test.jsonl", sampling=SAMPLING)
    model = build_tiny_model(work / "tiny")
    with contextlib.redirect_stdout(sys.stderr):
        sft_dir = _sft(model, build_dataset(format_only, sampling=SAMPLING), work / "sft", steps=sft_steps)
        before = _test_metrics(sft_dir, test)
        history = _grpo(sft_dir, train, work / "grpo", steps=grpo_steps)
        after = _test_metrics(work / "grpo", test)
        blank = _test_metrics(work / "grpo", _blank(test))
    ious = [float(e["rewards/iou_reward/mean"]) for e in history]
    fifth = max(1, len(ious) // 5)
    first, last = sum(ious[:fifth]) / fifth, sum(ious[-fifth:]) / fifth
    results = {
        "learning_iou": emit("learning_iou", last, first, "mean IoU reward (last 20% vs first 20% of GRPO steps)",
                             steps=len(ious), goal="ratio >= 2"),
        "test_iou": emit("test_iou_before_after", after[0], before[0], "test mIoU % (GRPO vs SFT model)",
                         queries=len(test), goal="ours > baseline"),
        "format_rate": emit("format_rate", after[1], before[1], "% of test answers in the exact format (after vs before)",
                            queries=len(test)),
    }
    results["uses_video"] = emit("uses_video", after[0], blank[0],
                                 "test mIoU % of the GRPO model, real frames vs blacked-out frames")
    emit("learning_wall_time", time.perf_counter() - started, 15 * 60, "s (ours) vs the 15-minute budget")
    if plot_to is not None:
        plot_learning(history, plot_to)
    (work / "history.json").write_text(json.dumps(history))
    return results
