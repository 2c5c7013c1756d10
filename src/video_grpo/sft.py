"""Optional cold-start SFT before GRPO: teach the ``<think>…</think><answer>S to E</answer>`` format.

    accelerate launch --config_file configs/accelerate/zero3.yaml -m video_grpo.sft --config configs/sft/<recipe>.yaml

R1-style video recipes often fine-tune briefly on the answer format before GRPO, so that the first GRPO
groups already contain parsable answers. This uses TRL's ``SFTTrainer`` with the same prompt, frame
sampling and processor path as GRPO (``video_grpo.data.dataset`` and ``video_grpo.inputs.processing``); the target is
``answer_template`` filled with the annotated span. The YAML holds ``SFTScriptArguments`` (GRPO's data and
video fields plus ``answer_template``), TRL's ``SFTConfig`` and ``ModelConfig``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

import torch
from transformers import AutoProcessor, set_seed
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_peft_config

from video_grpo.configs import GRPOScriptArguments, current_flag_names
from video_grpo.data.dataset import build_datasets
from video_grpo.inputs.families import ModelFamily, family_of_model
from video_grpo.inputs.processing import KeepVideoDtype, encode_rows, video_token_types
from video_grpo.rewards.answers import ANSWER_DECIMALS, render_solution
from video_grpo.runtime.deepspeed_imports import before_parsing, defer_muon_compile, shm_comm_build_skipped
from video_grpo.runtime.distributed import end_run, exit_process

logger = logging.getLogger(__name__)


@dataclass
class SFTScriptArguments(GRPOScriptArguments):
    """GRPO's data, video and prompt fields; ``answer_template`` is the SFT target."""


class VideoSFTTrainer(KeepVideoDtype, SFTTrainer):
    """TRL's SFTTrainer whose video inputs keep the dtype GRPO's forwards give them (processing's policy)."""


class VideoSFTCollator:
    """Rows -> prompt (with video) + target answer; the loss covers the answer tokens only."""

    def __init__(
        self, processor, answer_template: str, family: ModelFamily, decimals: int = ANSWER_DECIMALS
    ) -> None:
        self.processor = processor
        self.answer_template = answer_template
        self.decimals = (
            decimals  # the same precision as gt_guidance's guided answers (rewards.answers.ANSWER_DECIMALS)
        )
        self.family = family
        tokenizer = processor.tokenizer
        self.end_ids = tokenizer("<|im_end|>\n", add_special_tokens=False)["input_ids"]
        self.pad_id = tokenizer.pad_token_id
        self.video_token_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")

    def answer(self, row: dict) -> str:
        return render_solution(self.answer_template, row["solution"], row["sentence"], decimals=self.decimals)

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        encoded = encode_rows(self.processor, rows, self.family)
        answers = self.processor.tokenizer([self.answer(r) for r in rows], add_special_tokens=False)[
            "input_ids"
        ]
        sequences, labels = [], []
        for prompt, answer in zip(encoded["prompt_ids"], answers, strict=True):
            target = answer + self.end_ids
            sequences.append(prompt + target)
            labels.append([-100] * len(prompt) + target)
        width = max(len(s) for s in sequences)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        label_ids = torch.full((len(rows), width), -100, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (seq, lab) in enumerate(zip(sequences, labels, strict=True)):
            input_ids[i, : len(seq)] = torch.tensor(seq)
            label_ids[i, : len(lab)] = torch.tensor(lab)
            attention[i, : len(seq)] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention,
            "labels": label_ids,
            "pixel_values_videos": torch.cat(encoded["video_pixels"]),
            "video_grid_thw": encoded["video_grid_thw"],
            **{key: encoded[key] for key in self.family.time_input_keys},
            "mm_token_type_ids": video_token_types(input_ids, self.video_token_id),
        }


def main(script_args: SFTScriptArguments, training_args: SFTConfig, model_args: ModelConfig) -> None:
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    logger.setLevel(training_args.get_process_log_level())
    set_seed(training_args.seed)
    if not script_args.train_file and not script_args.train_sources:
        raise ValueError(
            "train_file: not set; point it at the training annotations (or declare train_sources)."
        )

    family = family_of_model(model_args.model_name_or_path, model_args.model_revision).with_text_timestamps(
        script_args.frame_timestamps_in_text
    )
    train_dataset, eval_dataset = build_datasets(script_args, family)
    processor = AutoProcessor.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision
    )
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        **(training_args.model_init_kwargs or {}),
    }
    training_args.remove_unused_columns = False  # rows carry frames and metadata for the collator
    training_args.dataset_kwargs = {**(training_args.dataset_kwargs or {}), "skip_prepare_dataset": True}
    if training_args.deepspeed_plugin is not None:  # Muon's kernels compiled on first use, not at import
        logger.debug(f"DeepSpeed's Muon compile deferred: {defer_muon_compile()}")
        logger.debug(f"DeepSpeed's CPU shm comm op build skipped: {shm_comm_build_skipped()}")
    trainer = VideoSFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=VideoSFTCollator(processor, script_args.answer_template, family),
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        processor.save_pretrained(training_args.output_dir)
    logger.info(f"SFT model saved to {training_args.output_dir}")
    end_run(trainer.accelerator)


def parse_args(args: list[str] | None = None):
    args = current_flag_names(args)
    # DeepSpeed's CPU shared-memory comm op (inference only) not built: 85 CPU s the first time in an environment.
    # Before the config is built: its __post_init__ may make the distributed state (runtime.deepspeed_imports)
    before_parsing(args)
    return TrlParser((SFTScriptArguments, SFTConfig, ModelConfig)).parse_args_and_config(args)


if __name__ == "__main__":
    main(*parse_args())
    exit_process(0)
