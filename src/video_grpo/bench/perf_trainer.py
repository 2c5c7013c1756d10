"""The small GRPO run the perf rows measure: ``VideoGRPOTrainer`` on ``data_samples`` with rewards that differ
within a group, so every measured step has real gradients."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "data_samples"


def length_reward(completions, **kwargs) -> list[float]:
    """Differs within a group, so every benchmarked step has nonzero advantages and real gradients."""
    return [float(len(str(c)) % 7) for c in completions]


def build_trainer(
    model_dir,
    out_dir,
    dataset,
    encode_once: bool = True,
    freeze: bool = False,
    peft_config=None,
    shared_prefix: bool | None = None,
    **overrides,
):
    from transformers import AutoProcessor
    from trl import GRPOConfig

    from video_grpo.rewards.functions import format_soft_reward, iou_reward
    from video_grpo.trainer import VideoGRPOTrainer

    settings = {
        "output_dir": str(out_dir),
        "per_device_train_batch_size": 8,
        "num_generations": 8,
        "steps_per_generation": 2,
        "gradient_accumulation_steps": 2,
        "max_completion_length": 16,
        "max_steps": 1,
        "learning_rate": 1e-4,
        "bf16": False,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "activation_checkpointing": False,
        "logging_steps": 1,
        "beta": 0.04,
        "loss_type": "grpo",
        "seed": 0,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    settings.update(overrides)
    return VideoGRPOTrainer(
        model=str(model_dir),
        reward_funcs=[iou_reward, format_soft_reward, length_reward],
        args=GRPOConfig(**settings),
        train_dataset=dataset,
        processing_class=AutoProcessor.from_pretrained(model_dir),
        peft_config=peft_config,
        encode_video_once=encode_once,
        freeze_vision_tower=freeze,
        shared_prefix=shared_prefix,
    )


def sample_dataset(sampling=None):
    from video_grpo.data.dataset import build_dataset
    from video_grpo.data.video import SamplingConfig

    sampling = sampling or SamplingConfig(
        fps=1.0, min_frames=4, max_frames=16, min_pixels=784, max_pixels=112 * 112, max_tokens=512
    )
    return build_dataset(SAMPLES / "train.jsonl", sampling=sampling)
