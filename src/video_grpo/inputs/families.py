"""What differs between the supported model families, in one place.

    family = detect_family(model.config)        # from config.model_type; unsupported types fail with the list

The trainer, data, encoder, evaluation and benchmark code ask the family instead of assuming Qwen2.5-VL:

- **Frame size and token cost.** A visual token covers ``size_multiple`` x ``size_multiple`` pixels of a pair
  of frames: 28 x 28 for Qwen2.5-VL (14-px patches merged 2 x 2), 32 x 32 for Qwen3-VL and Qwen3.5 (16-px).
- **How time reaches the model.** Qwen2.5-VL: ``second_per_grid_ts`` scales the temporal rotary positions
  (:mod:`video_grpo.inputs.positions` fixes their layout in transformers 5.24). Qwen3-VL / Qwen3.5: the processor
  writes ``<t seconds>`` before each temporal patch, the mean time of its two frames; we hand it the sampled
  frames' real timestamps, so variable-frame-rate files read right too.
- **Textual timestamps on Qwen2.5-VL** (``frame_timestamps_in_text``, TimeLens-7B):
  :meth:`ModelFamily.with_text_timestamps` gives a Qwen2.5-VL family whose prompt carries each temporal patch's time as text before it, in Qwen3-VL's
  form, ``<t seconds><|vision_start|>`` + that patch's placeholders + ``<|vision_end|>``, t the mean time of the
  patch's two frames (one decimal). TimeLens-7B's prompt says "the numbers before each video frame indicate its
  sampling timestamp"; their ``TimeLensProcessor`` (``processing_timelens.py`` on the TimeLens-7B model card) is
  transformers 4.57.1's Qwen2.5-VL processor modified for this. Its body is not in the stored sources we could
  read, so the exact text is Qwen3-VL's, which TimeLens-8B uses. Each patch is then its own vision block, which
  :mod:`video_grpo.inputs.positions` lays out as a one-patch grid (as for Qwen3-VL); the vision tower's features do not
  change (Qwen2.5-VL's vision attention never crosses a temporal patch).
- **The prompt text.** transformers 5.24's ``Qwen3VLProcessor`` expands only ``<|video_pad|>``, which leaves the
  chat template's ``<|vision_start|>`` / ``<|vision_end|>`` around the whole expanded video, one pair more than
  Qwen's reference processor and vLLM write; :meth:`ModelFamily.prompt_text` removes that pair first.
- **Layers that carry a state along the sequence.** Qwen3.5's Gated DeltaNet (``linear_attention``) layers;
  ``forkable_state`` names the layer types whose state :mod:`video_grpo.inputs.state_fork` can fork after a shared
  prompt, so packed forwards and one prefill per prompt stay exact.
- **Layers a compiled decode step may not trace as one graph.** On CUDA, transformers runs Qwen3.5's Gated DeltaNet
  through hub kernels where they are installed; ``kernel_layers`` names them, and the decode step is then compiled
  with graph breaks allowed (:func:`video_grpo.rollout.decode.step_fullgraph`).
- **What the vision encoder returns.** Qwen3-VL adds DeepStack features (one level per early text layer) to
  ``pooler_output``; :mod:`video_grpo.inputs.encoder` keeps each video's ``(pooler, *deepstack)`` together.

Placeholder ids (``image_token_id``, ``video_token_id``, ``vision_start_token_id``, ``vision_end_token_id``) and
``mm_token_type_ids`` (2 on video placeholders) read the same in every family's config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the planner reads families without torch (video_grpo.plan.cache)
    import torch

VIDEO_BLOCK = "<|vision_start|><|video_pad|><|vision_end|>"
VIDEO_PAD = "<|video_pad|>"
# The fields of transformers' VideoMetadata (it rejects others, e.g. our "timestamps").
PROCESSOR_METADATA_KEYS = ("total_num_frames", "fps", "width", "height", "duration")


@dataclass(frozen=True)
class ModelFamily:
    name: str
    model_types: tuple[str, ...]  # config.model_type values
    patch_size: int  # vision patch side in pixels
    time_in_text: bool  # True: "<t seconds>" text per temporal patch; False: second_per_grid_ts positions
    deepstack: bool = False  # the vision tower also returns deepstack_features
    spatial_merge: int = 2  # patches merged per side into one language-model token
    temporal_patch: int = 2  # frames per temporal patch
    # layer types carrying a sequence state that video_grpo.inputs.state_fork forks after a shared prompt
    forkable_state: tuple[str, ...] = ()
    text_timestamps: bool = False  # Qwen2.5-VL only: we write "<t seconds>" per temporal patch (TimeLens-7B)
    # layer types that transformers may run through hub kernels on CUDA, which a compiled decode step may not trace
    # as one graph (video_grpo.rollout.decode.step_fullgraph)
    kernel_layers: tuple[str, ...] = ()

    @property
    def size_multiple(self) -> int:
        """Frame sides must be multiples of this."""
        return self.patch_size * self.spatial_merge

    @property
    def pixels_per_token(self) -> int:
        """H x W pixels of one frame pair that become one visual token."""
        return self.size_multiple**2

    @property
    def time_input_keys(self) -> tuple[str, ...]:
        """Per-row float tensors, besides pixels and grid, that every forward needs for time."""
        return () if self.time_in_text else ("second_per_grid_ts",)

    def prompt_text(self, text: str) -> str:
        """The chat-template text the processor expands (see the module docstring for Qwen3's extra pair)."""
        return text.replace(VIDEO_BLOCK, VIDEO_PAD) if self.time_in_text else text

    def with_text_timestamps(self, on: bool = True) -> ModelFamily:
        """This family with each temporal patch's time written before it (TimeLens-7B); see the module doc.
        Qwen3-VL and Qwen3.5 already carry time in the text, so asking there is an error."""
        if not on:
            return self
        if self.time_in_text:
            raise ValueError(
                f"frame_timestamps_in_text: {self.name} already writes each frame's time in the prompt; "
                "the option is for Qwen2.5-VL (TimeLens-7B). Remove it from the recipe."
            )
        return replace(self, text_timestamps=True)

    def patch_times(self, metadata: dict) -> list[float]:
        """Each temporal patch's time: the mean of its first and last frame's real timestamps (an odd last frame
        repeated), as transformers' Qwen3VLProcessor computes it."""
        times = [float(t) for t in metadata["timestamps"]]
        if len(times) % self.temporal_patch:
            times += [times[-1]] * (self.temporal_patch - len(times) % self.temporal_patch)
        step = self.temporal_patch
        return [(times[i] + times[i + step - 1]) / 2 for i in range(0, len(times), step)]

    def interleave_timestamps(
        self, prompt_ids: list[int], grid_thw, metadata: dict, tokenizer, video_token_id: int
    ) -> list[int]:
        """``prompt_ids`` with its one video block ``<|vision_start|>`` + t x n placeholders + ``<|vision_end|>``
        rewritten as t blocks, each led by its ``<time seconds>`` tokens. Special tokens bound every piece, so
        tokenizing a piece alone gives the tokens the whole text would."""
        t, h, w = (int(v) for v in grid_thw)
        per_patch = h * w // self.spatial_merge**2
        first = prompt_ids.index(video_token_id)
        start, end = first - 1, first + t * per_patch  # the vision_start and vision_end around the run
        if prompt_ids[first:end].count(video_token_id) != t * per_patch or prompt_ids[end] == video_token_id:
            raise ValueError(f"expected one run of {t * per_patch} video placeholders in the prompt")
        vision_start, vision_end = prompt_ids[start], prompt_ids[end]
        times = self.patch_times(metadata)
        if len(times) != t:
            raise ValueError(f"{len(times)} frame-pair times for a video of {t} temporal patches")
        block = []
        for seconds in times:
            block += tokenizer(f"<{seconds:.1f} seconds>", add_special_tokens=False)["input_ids"]
            block += [vision_start, *[video_token_id] * per_patch, vision_end]
        return prompt_ids[:start] + block + prompt_ids[end + 1 :]

    def processor_metadata(self, metadata: dict) -> dict:
        """The processor's ``video_metadata`` entry for a sampled video (:func:`video_grpo.data.video.read_video`).

        Qwen3: the processor times frame i as ``frames_indices[i] / fps``; VideoMetadata has no timestamps field,
        so the real presentation times go in as indices with fps 1."""
        entry = {key: metadata[key] for key in PROCESSOR_METADATA_KEYS if key in metadata}
        if self.time_in_text:
            return {**entry, "fps": 1.0, "frames_indices": [float(t) for t in metadata["timestamps"]]}
        return {**entry, "frames_indices": list(metadata["frames_indices"])}

    def time_inputs(self, metadatas: list[dict]) -> dict[str, torch.Tensor]:
        """Qwen2.5-VL: ``second_per_grid_ts`` (float32, one per video) = temporal patch x the sampled frames' real
        mean spacing, not the processor's frames / fps estimate, which is wrong for variable-frame-rate files."""
        if self.time_in_text:
            return {}
        import torch

        from video_grpo.data.video import frame_spacing

        seconds = [self.temporal_patch * frame_spacing(metadata) for metadata in metadatas]
        return {"second_per_grid_ts": torch.tensor(seconds, dtype=torch.float32)}


QWEN2_5_VL = ModelFamily("qwen2_5_vl", ("qwen2_5_vl",), patch_size=14, time_in_text=False)
QWEN3_VL = ModelFamily("qwen3_vl", ("qwen3_vl",), patch_size=16, time_in_text=True, deepstack=True)
QWEN3_5 = ModelFamily(
    "qwen3_5",
    ("qwen3_5",),
    patch_size=16,
    time_in_text=True,
    forkable_state=("linear_attention",),
    kernel_layers=("linear_attention",),
)
FAMILIES = {family.name: family for family in (QWEN2_5_VL, QWEN3_VL, QWEN3_5)}


def supported_model_types() -> list[str]:
    return sorted(t for family in FAMILIES.values() for t in family.model_types)


def detect_family(config) -> ModelFamily:
    """The family of a model config (or a ``model_type`` string)."""
    model_type = config if isinstance(config, str) else getattr(config, "model_type", None)
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    raise ValueError(
        f"unsupported model type {model_type!r}: video_grpo supports {', '.join(supported_model_types())}. "
        "Point model_name_or_path at a Qwen2.5-VL, Qwen3-VL or Qwen3.5 checkpoint."
    )


def family_of_model(
    model_name_or_path: str, revision: str | None = None, trust_remote_code: bool = False
) -> ModelFamily:
    """Read only the model's config.json (no weights) and return its family; fails before any weights load."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            model_name_or_path, revision=revision, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise ValueError(
            f"model_name_or_path: cannot read the model config of {model_name_or_path!r} ({err}). "
            "It is needed to know the model family (frame size, time encoding)."
        ) from err
    return detect_family(config)


def family_of_recipe(recipe: str, override: str | None = None) -> ModelFamily:
    """For tools that read a recipe but load no model (data check, preprocess): ``override`` (a family name) if
    given, else the family of the recipe's ``model_name_or_path``."""
    if override:
        if override not in FAMILIES:
            raise ValueError(f"unknown model family {override!r}; choose one of {sorted(FAMILIES)}")
        return FAMILIES[override]
    import yaml

    with open(recipe) as f:
        model = (yaml.safe_load(f) or {}).get("model_name_or_path")
    if not model:
        raise ValueError(
            f"{recipe}: no model_name_or_path, so the model family is unknown; pass --model_family "
            f"({', '.join(sorted(FAMILIES))})."
        )
    try:
        return family_of_model(model)
    except ValueError as err:
        raise ValueError(f"{err} Offline, pass --model_family ({', '.join(sorted(FAMILIES))}).") from err
