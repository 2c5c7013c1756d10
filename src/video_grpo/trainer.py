"""``VideoGRPOTrainer``: TRL's GRPOTrainer with video that reaches every forward pass.

TRL 1.16 routes only ``image``/``images`` columns. With video prompts, generation can see the frames but the
old-policy, reference and loss forwards get none, and training silently continues on text alone. This
subclass keeps each sample's processed video with its row and feeds it to every forward, with the
``second_per_grid_ts`` of the *sampled* fps and the ``mm_token_type_ids`` that switch on Qwen2.5-VL's 3-D
(time, height, width) positions.

Rows carry three extra keys through TRL's shuffle-and-split of the generation batch:
``video_pixels`` (a list, one ``(patches, 1176)`` tensor per row; the G repeats of a prompt share one tensor),
``video_grid_thw`` ``(B, 3)`` and ``second_per_grid_ts`` ``(B,)``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import torch
from trl import GRPOTrainer

from video_grpo.encoder import install
from video_grpo.processing import encode_rows, video_kwargs, video_token_types, vision_placeholder_ids

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def shuffle_whole_groups(group_size: int):
    """Within the block, TRL's batch shuffle permutes groups of ``group_size`` consecutive rows (one prompt's
    generations) instead of single rows."""
    import trl.trainer.grpo_trainer as grpo_module

    row_shuffle = grpo_module.shuffle_sequence_dict

    def group_shuffle(batch: dict) -> dict:
        size = len(next(v for v in batch.values() if v is not None))
        if size % group_size:
            return row_shuffle(batch)
        order = (torch.randperm(size // group_size)[:, None] * group_size + torch.arange(group_size)).reshape(-1)

        def permute(value):
            if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
                return value
            return value[order] if isinstance(value, torch.Tensor) else [value[i] for i in order]

        return {key: permute(value) for key, value in batch.items()}

    grpo_module.shuffle_sequence_dict = group_shuffle
    try:
        yield
    finally:
        grpo_module.shuffle_sequence_dict = row_shuffle


class VideoGRPOTrainer(GRPOTrainer):
    """GRPO for video-language models. Dataset rows need ``prompt``, ``video_frames`` and ``video_metadata``
    (see :mod:`video_grpo.data`)."""

    def __init__(self, *args, grounding_eval_samples: int | None = 64, max_bad_sample_fraction: float = 0.05,
                 freeze_vision_tower: bool = False, encode_video_once: bool = True, **kwargs) -> None:
        """
        grounding_eval_samples: how many eval queries ``evaluate()`` answers greedily for R1@m / mIoU
            (None: all of them, 0: skip).
        max_bad_sample_fraction: stop when more than this share of the prompts seen had an unreadable video
            (each is replaced by another sample by the dataset; see ``video_grpo.data.VideoTransform``).
        freeze_vision_tower: train the language model only.
        encode_video_once: run the vision encoder once per unique video per forward (and, with a frozen
            tower, once per generation batch) instead of once per row; see ``video_grpo.encoder``.
        """
        super().__init__(*args, **kwargs)
        self.grounding_eval_samples = grounding_eval_samples
        self.max_bad_sample_fraction = max_bad_sample_fraction
        self._bad_samples_seen = 0
        self._samples_seen = 0
        self._warned_bad_videos: set[str] = set()
        visual = (self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model).model.visual
        if freeze_vision_tower:
            visual.requires_grad_(False)
        self.video_encoder = self.ref_video_encoder = None
        if encode_video_once:
            frozen = not any(p.requires_grad for p in visual.parameters())
            self.video_encoder = install(self.model, reuse_across_calls=frozen)
            if self.ref_model is not None:
                ref = self.accelerator.unwrap_model(self.ref_model) if self.is_deepspeed_enabled else self.ref_model
                self.ref_video_encoder = install(ref, reuse_across_calls=frozen,
                                                 share_cache_with=self.video_encoder if frozen else None)
        config = self.model.config
        self.video_token_id = config.video_token_id
        # TRL suppresses only <|image_pad|>; a sampled <|video_pad|> would break the next forward.
        suppressed = sorted(set(vision_placeholder_ids(config)) | set(self.generation_kwargs.get("suppress_tokens") or []))
        self.generation_kwargs["suppress_tokens"] = suppressed
        self.generation_config.suppress_tokens = suppressed
        self._video_rows: dict[str, Any] | None = None  # video inputs aligned with the rows being forwarded

    # -- evaluation ------------------------------------------------------------------------------------------

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """TRL's evaluation (sampled rewards), plus greedy grounding metrics on a held-out subset."""
        metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is not None and not isinstance(dataset, dict) and self.grounding_eval_samples != 0:
            grounding = {f"{metric_key_prefix}_{k}": v for k, v in self.grounding_metrics(dataset).items()}
            self.log(grounding)
            metrics.update(grounding)
        return metrics

    def grounding_metrics(self, dataset) -> dict[str, float]:
        """R1@{0.3,0.5,0.7} and mIoU (in %) from greedy answers, queries sharded over processes."""
        from accelerate.utils import gather_object
        from trl.models import unwrap_model_for_generation

        from video_grpo.evaluate import generate_answers, prediction_record, score_records

        count = len(dataset) if self.grounding_eval_samples is None else min(self.grounding_eval_samples, len(dataset))
        indices = list(range(count))[self.accelerator.process_index :: self.accelerator.num_processes]
        batch_size = self.args.per_device_eval_batch_size
        records = []
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=self.args.ds3_gather_for_generation) as model:
            was_training = model.training
            model.eval()
            for start in range(0, len(indices), batch_size):
                rows = dataset.__getitems__(indices[start : start + batch_size])
                outputs = generate_answers(model, self.processing_class, rows, self.max_completion_length)
                records += [prediction_record(row, out) for row, out in zip(rows, outputs, strict=True)]
            model.train(was_training)
        metrics = score_records(gather_object(records))
        return {k: v for k, v in metrics.items() if k.startswith("R1@") or k in ("mIoU", "num_parse_failures")}

    # -- TRL overrides ------------------------------------------------------------------------------------------

    def _account_bad_samples(self, inputs: list[dict]) -> None:
        """Count prompts whose video was replaced, log ``data/bad_samples``, and enforce the cap."""
        prompts = {x.get("row_index", i): x for i, x in enumerate(inputs)}
        bad = [x for x in prompts.values() if x.get("bad_sample")]
        for x in bad:
            if x["bad_sample"] not in self._warned_bad_videos:
                self._warned_bad_videos.add(x["bad_sample"])
                logger.warning(f"replaced a bad sample: {x['bad_sample']} (now training on {x['id']})")
        counts = torch.tensor([len(bad), len(prompts)], device=self.accelerator.device)
        counts = self.accelerator.reduce(counts, reduction="sum").tolist()
        self._bad_samples_seen += int(counts[0])
        self._samples_seen += int(counts[1])
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["data/bad_samples"].append(float(self._bad_samples_seen))
        minimum = max(10, math.ceil(1 / self.max_bad_sample_fraction)) if self.max_bad_sample_fraction > 0 else 1
        fraction = self._bad_samples_seen / max(self._samples_seen, 1)
        if self._samples_seen >= minimum and fraction > self.max_bad_sample_fraction:
            raise RuntimeError(
                f"{self._bad_samples_seen} of {self._samples_seen} samples seen so far had an unreadable video "
                f"({fraction:.1%} > max_bad_sample_fraction={self.max_bad_sample_fraction}). Run "
                "`python -m video_grpo.data check --config <recipe> --decode` to list them, fix or drop them, "
                "or raise max_bad_sample_fraction."
            )

    # Why: TRL drops video; process it once here and keep it on every row of the generation batch.
    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        if self.video_encoder is not None:
            self.video_encoder.reset()  # a frozen tower's cached features live for one generation batch
        self._account_bad_samples(inputs)
        self._video_rows = encode_rows(self.processing_class, inputs, self.chat_template_kwargs)
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            rows, self._video_rows = self._video_rows, None
        output["video_pixels"] = rows["video_pixels"]
        output["video_grid_thw"] = rows["video_grid_thw"]
        output["second_per_grid_ts"] = rows["second_per_grid_ts"]
        return output

    # Why: TRL shuffles rows; shuffling whole prompt groups keeps a video's G rows in one micro-batch, so the
    # loss forward encodes it once. Micro-batches stay equal-sized, so the summed gradient is unchanged.
    def _prepare_inputs(self, generation_batch):
        if self.video_encoder is None or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        with shuffle_whole_groups(self.num_generations):
            return super()._prepare_inputs(generation_batch)

    # Why: generation must see the same token ids and video tensors as the later forwards.
    def _tokenize_prompts(self, prompts: list):
        rows = self._video_rows
        multimodal_fields = {
            "pixel_values_videos": torch.cat(rows["video_pixels"]),
            "video_grid_thw": rows["video_grid_thw"],
            "second_per_grid_ts": rows["second_per_grid_ts"],
            "mm_token_type_ids": [
                video_token_types(torch.tensor(ids), self.video_token_id).tolist() for ids in rows["prompt_ids"]
            ],
        }
        return rows["prompt_ids"], None, multimodal_fields

    # Why: the loss forward gets its rows' video back (TRL passes only image tensors).
    def _compute_loss(self, model, inputs: dict[str, Any]):
        self._video_rows = {k: inputs[k] for k in ("video_pixels", "video_grid_thw", "second_per_grid_ts")}
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._video_rows = None

    # Why: TRL slices only image tensors per chunk; we slice the rows' video tensors the same way.
    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **image_kwargs,
    ):
        if self._video_rows is None:  # text-only batch
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **image_kwargs,
            )
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies, all_aux = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            ids, mask = input_ids[start:end], attention_mask[start:end]
            model_inputs = {"input_ids": ids, "attention_mask": mask, **video_kwargs(self._video_rows, slice(start, end), ids, self.video_token_id)}
            if compute_aux_loss:
                model_inputs["output_router_logits"] = True
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, :-logits_to_keep] = -100  # only completion tokens are scored
            with self.accelerator.autocast():
                outputs = model(**model_inputs, labels=labels, fused_lm_head=True)
            all_logps.append(outputs.log_probs[:, -logits_to_keep:])
            if compute_entropy:
                all_entropies.append(outputs.entropy[:, -logits_to_keep:])
            if compute_aux_loss:
                all_aux.append(outputs.aux_loss)
        logps = torch.cat(all_logps, dim=0)
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        aux_loss = torch.stack(all_aux).mean() if compute_aux_loss else None
        return logps, entropies, aux_loss
