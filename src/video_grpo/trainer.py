"""``VideoGRPOTrainer``: TRL's GRPOTrainer with video that reaches every forward pass, for every model family.

TRL 1.16 routes only ``image``/``images`` columns. With video prompts, generation can see the frames but the
old-policy, reference and loss forwards get none, and training silently continues on text alone. This
subclass keeps each sample's processed video with its row and feeds it to every forward, with its time
(Qwen2.5-VL: ``second_per_grid_ts`` from the sampled frames' timestamps; Qwen3-VL / Qwen3.5: ``<t seconds>``
text in the prompt) and the ``mm_token_type_ids`` that switch on the 3-D (time, height, width) positions.
What differs between families comes from :mod:`video_grpo.inputs.families`.

Rows carry their video through TRL's shuffle-and-split of the generation batch: ``video_pixels`` (a list, one
``(patches, C)`` tensor per row; the G repeats of a prompt share one tensor), ``video_grid_thw`` ``(B, 3)``,
and the family's time inputs (``second_per_grid_ts`` ``(B,)`` for Qwen2.5-VL).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import torch
from trl import GRPOTrainer

from video_grpo.data.dataset import set_replacement_weights
from video_grpo.data.sample_weights import SamplerEpoch, WeightedRepeatSampler, relative_weights
from video_grpo.inputs import state_fork
from video_grpo.inputs.encoder import install
from video_grpo.inputs.families import detect_family
from video_grpo.inputs.prefix import (
    PackedRows,
    forkable_state,
    pack_rows,
    unforkable_layers,
    unsupported_reason,
)
from video_grpo.inputs.processing import (
    KeepVideoDtype,
    concat,
    encode_rows,
    unique_videos,
    video_kwargs,
    video_row_keys,
    video_token_types,
    vision_placeholder_ids,
)
from video_grpo.loss.guidance import group_advantages, guided_completion_ids, guided_mask
from video_grpo.rewards.functions import DEFAULT_ANSWER_TEMPLATE
from video_grpo.rewards.span_scoring import check_span_scoring
from video_grpo.rollout.decode import (
    CompiledDecoder,
    DecodeStats,
    decode_compile_on,
    decode_settings,
    parse_decode_compile,
    step_shape,
)
from video_grpo.rollout.prefill import one_prefill_per_prompt
from video_grpo.runtime.checkpointing import keep_one_input_grad_hook

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
        order = (torch.randperm(size // group_size)[:, None] * group_size + torch.arange(group_size)).reshape(
            -1
        )

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


def resolve_shared_prefix(requested: bool | None, config) -> bool:
    """``shared_prefix`` after checking the model: None turns it on where it is exact (one warning otherwise)."""
    reason = unsupported_reason(config)
    if reason is None:
        return requested is not False
    if requested:
        raise ValueError(f"shared_prefix: cannot be exact here: {reason}. Set shared_prefix: false.")
    if requested is None:
        logger.warning(
            f"shared_prefix is off: {reason}. Each answer's row carries its own copy of the prompt."
        )
    return False


class VideoGRPOTrainer(KeepVideoDtype, GRPOTrainer):
    """GRPO for video-language models. Dataset rows need ``prompt``, ``video_frames`` and ``video_metadata``
    (see :mod:`video_grpo.data.dataset`)."""

    def __init__(
        self,
        *args,
        grounding_eval_samples: int | None = 64,
        span_scoring: str = "best_window",
        span_reader: str = "ours",
        max_bad_sample_fraction: float = 0.05,
        freeze_vision_tower: bool = False,
        encode_video_once: bool = True,
        gt_guidance: bool = False,
        advantage_shaping: str = "none",
        answer_template: str = DEFAULT_ANSWER_TEMPLATE,
        shared_prefix: bool | None = None,
        frame_timestamps_in_text: bool = False,
        train_vision_merger: bool = False,
        decode_compile: str | bool = "auto",
        decode_compile_backend: str = "inductor",
        decode_cuda_graphs: bool = False,
        decode_cache_tokens: int | None = None,
        sample_weights: torch.Tensor | None = None,
        **kwargs,
    ) -> None:
        """
        grounding_eval_samples: how many eval queries ``evaluate()`` answers greedily for R1@m / mIoU
            (None: all of them, 0: skip). span_scoring: how those answers are scored (the recipe's
            ``span_scoring``; :mod:`video_grpo.rewards.span_scoring`). span_reader: how ``set`` reads an answer (the recipe's
            rewards' reader, :func:`video_grpo.rewards.functions.recipe_reader`).
        max_bad_sample_fraction: stop when more than this share of the prompts seen had an unreadable video
            (each is replaced by another sample by the dataset; see ``video_grpo.data.dataset.VideoTransform``).
        freeze_vision_tower: train the language model only. train_vision_merger: with it, the vision module's
            merger (its projection into the language model) still trains, as in TimeLens.
        encode_video_once: run the vision encoder once per unique video per forward (and, with a frozen
            tower, once per generation batch) instead of once per row; see ``video_grpo.inputs.encoder``.
        gt_guidance, advantage_shaping, answer_template: ground-truth-guided groups (TempSamp-R1); see
            ``video_grpo.loss.guidance``.
        shared_prefix: old-policy, reference and loss forwards run each prompt through the language model once
            per micro-batch (``video_grpo.inputs.prefix``). None: on where that is exact, else off with one warning;
            True: on, and an error where it cannot be exact; False: off.
        frame_timestamps_in_text: Qwen2.5-VL prompts carry each temporal patch's time as text (TimeLens-7B;
            ``video_grpo.inputs.families``), in generation, every forward and the grounding evaluation.
        decode_compile, decode_compile_backend: decode from one static cache with a compiled step
            (``video_grpo.rollout.decode``): "auto" on CUDA, "true" everywhere, "false" eagerly. decode_cuda_graphs: replay
            it as a CUDA graph where that is safe (the cache then stays allocated). decode_cache_tokens: the
            static cache's length, the longest prompt the recipe allows + max_completion_length (None: from the
            first generation call).
        sample_weights: each training row's draw probability (TimeLens2's, ``video_grpo.data.sample_weights``); each
            epoch then orders the prompts by weight, without replacement. None: TRL's shuffled pass.
        """
        super().__init__(*args, **kwargs)
        if sample_weights is not None and len(sample_weights) != len(self.train_dataset):
            raise ValueError(
                f"sample_weights: {len(sample_weights)} weights for {len(self.train_dataset)} training rows"
            )
        self.sample_weights = sample_weights
        if sample_weights is not None:  # a bad video's replacement is drawn as the sampler draws
            set_replacement_weights(self.train_dataset, sample_weights)
        self._sampler_epoch = SamplerEpoch()  # names each epoch to the weighted sampler, also after a resume
        if sample_weights is not None:
            self.add_callback(self._sampler_epoch)
        # TRL switches checkpointing off and on around generation; each switch-on adds an input-gradient hook
        keep_one_input_grad_hook(self.model)
        self.gt_guidance = gt_guidance
        self.advantage_shaping = advantage_shaping
        self.answer_template = answer_template
        if (
            gt_guidance or advantage_shaping != "none"
        ) and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "gt_guidance and advantage_shaping need multi_objective_aggregation='sum_then_normalize' "
                f"(got {self.multi_objective_aggregation!r})."
            )
        self._guided: dict[int, list[int]] = {}  # row -> guided answer tokens, for the batch being generated
        self._rewards_per_func: torch.Tensor | None = None
        self.grounding_eval_samples = grounding_eval_samples
        check_span_scoring(span_scoring, span_reader)  # now, not at the first evaluation
        self.span_scoring, self.span_reader = span_scoring, span_reader
        self.max_bad_sample_fraction = max_bad_sample_fraction
        self._bad_samples_seen = 0
        self._samples_seen = 0
        self._warned_bad_videos: set[str] = set()
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        self.family = detect_family(base.config).with_text_timestamps(frame_timestamps_in_text)
        visual = base.model.visual
        if freeze_vision_tower:
            visual.requires_grad_(False)
            if train_vision_merger:
                visual.merger.requires_grad_(True)
        self.video_encoder = self.ref_video_encoder = None
        if encode_video_once:
            frozen = not any(p.requires_grad for p in visual.parameters())
            self.video_encoder = install(self.model, reuse_across_calls=frozen)
            if self.ref_model is not None:
                ref = (
                    self.accelerator.unwrap_model(self.ref_model)
                    if self.is_deepspeed_enabled
                    else self.ref_model
                )
                self.ref_video_encoder = install(
                    ref, reuse_across_calls=frozen, share_cache_with=self.video_encoder if frozen else None
                )
        self.shared_prefix = resolve_shared_prefix(shared_prefix, base.config)
        # One prefill per prompt in generate: exact with any attention backend, and with sequence-state layers
        # whose state the prefill's cache copies (video_grpo.rollout.prefill)
        self.shared_prefill = shared_prefix is not False and not unforkable_layers(base.config)
        self.decoder = self._compiled_decoder(
            decode_compile, decode_compile_backend, decode_cuda_graphs, decode_cache_tokens
        )
        self._fork_state = forkable_state(base.config)  # packed forwards fork Gated DeltaNet states
        if self._fork_state:
            # Wrapped now, before anything compiles the model: wrapped at the first packed forward, the layers'
            # forward changed under the compiled decode step, which recompiled at the next generation call (one
            # unexpected recompile a run; found by python -m video_grpo.bench soak --family qwen3_5)
            state_fork.install()
        self._language_model = base.model  # its get_rope_index lays out the packed rows' positions
        self._eager_attention = getattr(base.config, "_attn_implementation", None) == "eager"
        self.prefix_positions = [0, 0]  # (plain, packed) token positions of the shared-prefix forwards so far
        self._warned_unpackable = False
        config = self.model.config
        self.video_token_id = config.video_token_id
        # TRL suppresses only <|image_pad|>; a sampled <|video_pad|> would break the next forward.
        suppressed = sorted(
            set(vision_placeholder_ids(config)) | set(self.generation_kwargs.get("suppress_tokens") or [])
        )
        self.generation_kwargs["suppress_tokens"] = suppressed
        self.generation_config.suppress_tokens = suppressed
        self._video_rows: dict[str, Any] | None = None  # video inputs aligned with the rows being forwarded

    def _compiled_decoder(
        self, value, backend: str, cuda_graphs: bool, cache_tokens: int | None
    ) -> CompiledDecoder | None:
        """The generation calls' static cache and compiled step (``video_grpo.rollout.decode``), or None to decode eagerly.

        Rows: a training generation call's (micro-batch x steps_per_generation), or an evaluation batch's if that
        is larger; smaller calls are padded to it, so one graph serves both."""
        value = parse_decode_compile(value)
        device = self.accelerator.device
        if not decode_compile_on(value, device):
            return None
        plugin = self.accelerator.state.deepspeed_plugin
        settings, why = decode_settings(
            backend,
            device,
            zero_stage=plugin.zero_stage if plugin is not None else 0,
            gather_for_generation=self.args.ds3_gather_for_generation,
            cuda_graphs=cuda_graphs,
            **step_shape(self.model.config),
        )
        if settings is None:
            if value == "true":
                raise ValueError(
                    f"decode_compile: {why}. Set ds3_gather_for_generation: true or decode_compile: false."
                )
            logger.warning(f"decode_compile is off: {why}.")
            return None
        rows = self.args.per_device_train_batch_size * self.args.steps_per_generation
        if self.args.eval_strategy != "no":
            rows = max(rows, self.args.per_device_eval_batch_size)
        logger.warning(
            f"decode_compile: {why}; static cache of {rows} rows x "
            f"{cache_tokens or 'the first call'} positions"
            + (" (kept for the run)" if settings.persistent else "")
        )
        return CompiledDecoder(rows, cache_tokens, settings, strict=value == "true")

    # -- evaluation ------------------------------------------------------------------------------------------

    def evaluate(
        self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """TRL's evaluation (sampled rewards), plus greedy grounding metrics on a held-out subset.

        A frozen tower's feature cache is set aside meanwhile: the training batch's features stay, the eval
        videos' do not."""
        aside = self.video_encoder.set_aside() if self.video_encoder is not None else contextlib.nullcontext()
        with aside:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
            dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
            if dataset is not None and not isinstance(dataset, dict) and self.grounding_eval_samples != 0:
                grounding = {
                    f"{metric_key_prefix}_{k}": v for k, v in self.grounding_metrics(dataset).items()
                }
                self.log(grounding)
                metrics.update(grounding)
        return metrics

    def get_eval_dataloader(self, eval_dataset=None):
        """transformers' evaluation loader, without a leak: it prepares a new loader at each evaluation, and
        accelerate keeps every loader it prepared (``Accelerator._dataloaders``, saved with each checkpoint), one
        more per evaluation for the whole run (found by ``python -m video_grpo.bench soak --eval_every``). The
        previous evaluation's loader is dropped from that list when the next one is made."""
        loader = super().get_eval_dataloader(eval_dataset)
        previous = getattr(self, "_last_eval_loader", None)
        if previous is not None and previous is not loader:
            prepared = self.accelerator._dataloaders
            prepared[:] = [kept for kept in prepared if kept is not previous]
        self._last_eval_loader = loader
        return loader

    def grounding_metrics(self, dataset) -> dict[str, float]:
        """R1@{0.3,0.5,0.7} and mIoU (in %) from greedy answers, queries sharded over processes.

        Every rank runs the same number of ``generate`` batches: under ZeRO-3, transformers generates in
        lock-step across ranks (``synced_gpus``), so a rank with one batch more than another would wait forever.
        Short shards are padded with a repeat of one of their queries, whose answer is then dropped."""
        from accelerate.utils import gather_object
        from trl.models import unwrap_model_for_generation

        from video_grpo.evaluate import generate_answers, prediction_record, score_records

        count = (
            len(dataset)
            if self.grounding_eval_samples is None
            else min(self.grounding_eval_samples, len(dataset))
        )
        ranks, rank = self.accelerator.num_processes, self.accelerator.process_index
        indices = list(range(count))[rank::ranks]
        batch_size = self.args.per_device_eval_batch_size
        batches = math.ceil(
            math.ceil(count / ranks) / batch_size
        )  # the longest shard's batch count, on every rank
        padded = indices + [indices[-1] if indices else 0] * (batches * batch_size - len(indices))
        records = []
        encoder = (
            self.video_encoder.bypassing() if self.video_encoder is not None else contextlib.nullcontext()
        )
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                # on exit it turns checkpointing back on: with the run's settings, as TRL's generation does
                # (PEFT + ZeRO-3 needs use_reentrant=True, which transformers' defaults would drop)
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as model,
            encoder,
        ):
            was_training = model.training
            model.eval()
            for start in range(0, len(padded), batch_size):
                batch = padded[start : start + batch_size]
                rows = dataset.__getitems__(batch)
                outputs = generate_answers(
                    model,
                    self.processing_class,
                    rows,
                    self.max_completion_length,
                    text_timestamps=self.family.text_timestamps,
                    decoder=self.decoder,
                )
                real = max(0, min(batch_size, len(indices) - start))  # the rest of the batch is padding
                records += [
                    prediction_record(row, out, span_scoring=self.span_scoring, reader=self.span_reader)
                    for row, out in zip(rows[:real], outputs[:real], strict=True)
                ]
            model.train(was_training)
        metrics = score_records(gather_object(records), self.span_scoring, self.span_reader)
        return {
            k: v for k, v in metrics.items() if k.startswith("R1@") or k in ("mIoU", "num_parse_failures")
        }

    # -- TRL overrides ------------------------------------------------------------------------------------------

    def _account_bad_samples(self, inputs: list[dict]) -> None:
        """Count prompts whose video was replaced, log ``data/bad_samples``, and enforce the cap."""
        prompts = {x.get("drawn_row_index", x.get("row_index", i)): x for i, x in enumerate(inputs)}
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
        minimum = (
            max(10, math.ceil(1 / self.max_bad_sample_fraction)) if self.max_bad_sample_fraction > 0 else 1
        )
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
        # With draw weights, log N p(q) averaged over the drawn prompts (1 for a uniform draw): the drawn row's,
        # also where a bad video was replaced by another row (video_grpo.data.dataset.VideoTransform)
        if self.sample_weights is not None and self.model.training:
            drawn = [x.get("drawn_row_index", x.get("row_index", -1)) for x in inputs]
            rows = relative_weights(self.sample_weights, drawn)
            gathered = self.accelerator.gather(rows.to(self.accelerator.device))
            self._metrics["train"]["sample_weight/relative_weight"].append(torch.nanmean(gathered).item())
        self._video_rows = encode_rows(self.processing_class, inputs, self.family, self.chat_template_kwargs)
        reshape = self.model.training and (self.gt_guidance or self.advantage_shaping != "none")
        if self.gt_guidance and self.model.training:
            mask = guided_mask(self.accelerator.process_index, len(inputs), self.num_generations)
            self._guided = {
                i: guided_completion_ids(
                    self._tokenizer, inputs[i], self.answer_template, self.eos_token_ids[0]
                )
                for i, guided in enumerate(mask)
                if guided
            }
        try:
            output = super()._generate_and_score_completions(inputs)
            if reshape:
                self._reshape_advantages(output, len(inputs))
        finally:
            rows, self._video_rows = self._video_rows, None
            self._guided = {}
        output.update({key: rows[key] for key in video_row_keys(self.family)})
        return output

    # Why: with TimeLens2's draw weights, prompts are drawn by weight (video_grpo.data.sample_weights), in TRL's layout.
    def _get_train_sampler(self, dataset=None):
        if self.sample_weights is None:
            return super()._get_train_sampler(dataset)
        sampler = WeightedRepeatSampler(
            self.sample_weights,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            seed=self.args.seed,
        )
        if getattr(self, "_sampler_epoch", None) is not None:
            self._sampler_epoch.sampler = sampler
        return sampler

    # Why: each prompt is prefilled once for its G answers (video_grpo.rollout.prefill); with gt_guidance, the last
    # answer of each group is the annotated span, not a sample.
    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        model = self.accelerator.unwrap_model(self.model_wrapped)  # what TRL's generate call runs on
        counts = [0, 0]  # rows generated, rows prefilled
        decoder = self.decoder if self.decoder is not None and self.decoder.enabled else None
        patch = (
            one_prefill_per_prompt(
                model, counts if self.shared_prefill else None, decoder, share=self.shared_prefill
            )
            if self.shared_prefill or decoder is not None
            else contextlib.nullcontext()
        )
        with patch:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        mode = "train" if self.model.training else "eval"
        if counts[0]:
            self._metrics[mode]["shared_prefix/prefill_ratio"].append(counts[1] / counts[0])
        compiled = decoder is not None and decoder.enabled and decoder.last_call_compiled
        self._metrics[mode]["decode/compiled"].append(float(compiled))
        stats = self.decoder.stats if self.decoder is not None else DecodeStats()
        for name in ("graphs", "recompiles", "fallbacks", "cache_growths", "cuda_graph_skips"):
            self._metrics[mode][f"decode/{name}"].append(float(getattr(stats, name)))
        for row, ids in self._guided.items():
            completion_ids[row] = ids
        return completion_ids, logprobs

    # Why: keep the gathered per-function rewards, which advantage shaping starts from.
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    def _reshape_advantages(self, output: dict, local_rows: int) -> None:
        """Replace TRL's advantages by ``video_grpo.loss.guidance.group_advantages`` (guided groups, shaping)."""
        rewards = self._rewards_per_func
        size = rewards.shape[0]
        guided = torch.tensor(
            guided_mask(0, size, self.num_generations) if self.gt_guidance else [False] * size
        )
        advantages = group_advantages(
            rewards,
            self.reward_weights,
            self.num_generations,
            guided,
            self.advantage_shaping,
            self.scale_rewards,
        )
        start = self.accelerator.process_index * local_rows
        output["advantages"] = advantages[start : start + local_rows].to(output["advantages"].device)
        for _ in range(size):  # the logged table shows the advantages the loss uses
            self._logs["advantages"].pop()
        self._logs["advantages"].extend(advantages.tolist())
        if self.gt_guidance:
            sampled = advantages.view(-1, self.num_generations)[:, :-1]
            self._metrics["train"]["guidance/groups_all_sampled_negative"].append(
                (sampled < 0).all(dim=1).float().mean().item()
            )
            # The accuracy reward of the policy's own answers (TRL's rewards/<name>/mean counts the guided ones too)
            self._metrics["train"]["guidance/sampled_accuracy_reward"].append(
                torch.nanmean(rewards[~guided.to(rewards.device), 0]).item()
            )

    # Why: TRL shuffles rows; shuffling whole prompt groups keeps a video's G rows in one micro-batch, so the
    # loss forward encodes it once. Micro-batches stay equal-sized, so the summed gradient is unchanged.
    def _prepare_inputs(self, generation_batch):
        if self.video_encoder is None or not self.model.training:
            return super()._prepare_inputs(generation_batch)
        with shuffle_whole_groups(self.num_generations):
            return super()._prepare_inputs(generation_batch)

    # Why: generation must see the same token ids and video tensors as the later forwards. With one prefill per
    # prompt, generation gets each video's pixels once plus each row's video index (video_grpo.rollout.prefill), not G
    # copies; the plain generate needs one copy per row.
    def _tokenize_prompts(self, prompts: list):
        rows = self._video_rows
        if self.shared_prefill:
            videos, index = unique_videos(rows["video_pixels"])
            pixels = {"pixel_values_videos": concat(videos), "video_index": index}
        else:
            pixels = {"pixel_values_videos": concat(rows["video_pixels"])}
        multimodal_fields = {
            **pixels,
            "video_grid_thw": rows["video_grid_thw"],
            **{key: rows[key] for key in self.family.time_input_keys},
            "mm_token_type_ids": [
                video_token_types(torch.tensor(ids), self.video_token_id).tolist()
                for ids in rows["prompt_ids"]
            ],
        }
        return rows["prompt_ids"], None, multimodal_fields

    # Why: the loss forward gets its rows' video back (TRL passes only image tensors).
    def _compute_loss(self, model, inputs: dict[str, Any]):
        self._video_rows = {key: inputs[key] for key in video_row_keys(self.family)}
        plain, packed = self.prefix_positions
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._video_rows = None
        if (
            self.prefix_positions[0] > plain
        ):  # the share of the plain forward's token positions this one carried
            ratio = (self.prefix_positions[1] - packed) / (self.prefix_positions[0] - plain)
            self._metrics["train" if self.model.training else "eval"]["shared_prefix/position_ratio"].append(
                ratio
            )
        return loss

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
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **image_kwargs,
            )
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies, all_aux = [], [], []
        with self._cached_video_features():
            for start in range(0, input_ids.size(0), batch_size):
                end = min(start + batch_size, input_ids.size(0))
                ids, mask = input_ids[start:end], attention_mask[start:end]
                packed = (
                    self._pack(ids, mask, logits_to_keep, slice(start, end)) if not compute_aux_loss else None
                )
                if packed is not None:
                    with self.accelerator.autocast():
                        outputs = model(
                            **packed.model_inputs, shift_labels=packed.shift_labels, fused_lm_head=True
                        )
                    all_logps.append(packed.unpack(outputs.log_probs))
                    if compute_entropy:
                        all_entropies.append(packed.unpack(outputs.entropy))
                    continue
                # Built only when packing falls back: the rows' pixels, one copy per row, on the device
                model_inputs = {
                    "input_ids": ids,
                    "attention_mask": mask,
                    **video_kwargs(self._video_rows, slice(start, end), ids, self.video_token_id),
                }
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

    def _pack(
        self, ids: torch.Tensor, mask: torch.Tensor, completion_length: int, rows: slice
    ) -> PackedRows | None:
        """The rows packed by shared prompt (``video_grpo.inputs.prefix``), or None for the plain forward."""
        if not self.shared_prefix:
            return None
        packed = pack_rows(
            ids,
            mask,
            completion_length,
            self._video_rows,
            rows,
            self._language_model.get_rope_index,
            self.video_token_id,
            self._tokenizer.pad_token_id,
            # eager attention adds a float mask to the scores: in the model's dtype (read now: DeepSpeed casts the
            # model when training starts), or bf16 scores would be promoted to float32
            self._language_model.get_input_embeddings().weight.dtype if self._eager_attention else None,
            fork_state=self._fork_state,
        )
        if packed is None:
            if not self._warned_unpackable:
                self._warned_unpackable = True
                logger.warning(
                    "shared_prefix: a micro-batch is not laid out as left-padded prompts and right-padded "
                    "completions; it runs the plain forward (exact, without the saving)."
                )
            return None
        self.prefix_positions[0] += packed.plain_positions
        self.prefix_positions[1] += packed.packed_positions
        return packed

    @contextlib.contextmanager
    def _cached_video_features(self):
        """Every forward after generation (old policy, reference, loss) takes a frozen tower's features from the
        cache generation filled; it never runs the tower itself, on any rank (see ``video_grpo.inputs.encoder``)."""
        with contextlib.ExitStack() as stack:
            for encoder in (self.video_encoder, self.ref_video_encoder):
                if encoder is not None:
                    stack.enter_context(encoder.serving())
            yield
