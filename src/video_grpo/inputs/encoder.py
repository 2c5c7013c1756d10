"""Run the vision encoder once per unique video instead of once per row (every model family).

GRPO repeats every prompt G times, so a batch holds each video G times, and a plain forward encodes it G
times: in generation, in the old-policy and reference passes, and in the loss. :class:`VideoEncoderOnce`
replaces ``get_video_features`` on one model instance (both ``generate`` and ``forward`` call it there):

- within a call, identical videos (same grid and same pixels, compared exactly) go through the encoder
  once and their features (with Qwen3-VL's DeepStack levels) are shared by every row that shows them.
  Autograd then sums the rows' gradients into that one encoding, which is the same gradient as encoding
  each copy separately;
- with a frozen vision tower, features are also kept across calls until :meth:`reset` (the trainer resets
  at every new generation batch), so generation, the old-policy pass, the reference pass and the loss all
  reuse one encoding per video.

ZeRO-3 needs every rank to run the encoder equally often, so whether a forward runs it must not depend on
what a rank's cache happens to hold. It never does:

- a trainable tower runs once in every forward (each forward has videos, and its new videos go in one call);
- a frozen tower runs once per generation batch, in generation's prefill, which stores the features. The
  trainer then puts the hook in :meth:`serving` mode for every later forward of that batch (old policy,
  reference, loss): there the encoder never runs, and a video missing from the cache is an error, not a
  silent extra encoder call on one rank. Cache hits are exact: the video inputs are bit-identical across
  the forwards of a batch (see the policy in :mod:`video_grpo.inputs.processing`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling


@dataclass
class EncoderStats:
    calls: int = 0  # forwards that asked for video features
    encoder_runs: int = 0  # times the vision tower actually ran
    rows_requested: int = 0  # patch rows the model asked to encode
    rows_encoded: int = 0  # patch rows that actually went through the encoder


class VideoEncoderOnce:
    def __init__(self, model_core, reuse_across_calls: bool = False, deepstack: bool = False) -> None:
        """``model_core``: the inner model (``model.model``: ``Qwen2_5_VLModel``, ``Qwen3VLModel``...) whose
        ``get_video_features`` is replaced. ``deepstack``: the tower also returns DeepStack features (Qwen3-VL)."""
        self.original = model_core.get_video_features
        self.deepstack = deepstack
        self.merge = model_core.visual.spatial_merge_size**2
        self.reuse_across_calls = reuse_across_calls
        self.cache: list[tuple[tuple, torch.Tensor, tuple]] = []  # (key, pixels, (pooler, *deepstack levels))
        self.stats = EncoderStats()
        self.use_cache = True  # False inside bypassing()
        self.must_hit = False  # in serving mode: every video must come from the cache
        model_core.get_video_features = self

    def reset(self) -> None:
        self.cache.clear()

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Frozen tower: within the block every video must come from the cache (filled by generation); a miss
        raises instead of running the encoder on this rank only. A trainable tower encodes as usual."""
        previous, self.must_hit = self.must_hit, self.reuse_across_calls
        try:
            yield
        finally:
            self.must_hit = previous

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Run the block with an empty cache and give the current one back afterwards: an evaluation between
        two optimizer steps of one generation batch must not evict that batch's features. In place, so a
        reference model sharing this cache sees the same."""
        saved = list(self.cache)
        self.cache.clear()
        try:
            yield
        finally:
            self.cache[:] = saved

    @contextlib.contextmanager
    def bypassing(self) -> Iterator[None]:
        """Neither read nor fill the cache: every forward encodes its videos (once each). For held-out
        evaluation, whose videos are not reused; reading the cache there would make a rank skip the tower
        whenever it happens to hold a video, and others not."""
        previous, self.use_cache = self.use_cache, False
        try:
            yield
        finally:
            self.use_cache = previous

    @staticmethod
    def _key(pixels: torch.Tensor, grid: torch.Tensor) -> tuple:
        sample = pixels.reshape(-1)[:: max(1, pixels.numel() // 4096)]
        return (tuple(grid.tolist()), tuple(pixels.shape), float(sample.double().sum()))

    def _find(self, entries, key, pixels):
        for entry_key, entry_pixels, features in entries:
            if entry_key == key and torch.equal(entry_pixels, pixels):
                return features
        return None

    def __call__(
        self, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor | None = None, **kwargs
    ):
        kwargs.pop("return_dict", None)
        rows = video_grid_thw.prod(-1).tolist()
        videos = torch.split(pixel_values_videos, rows)
        self.stats.calls += 1
        self.stats.rows_requested += pixel_values_videos.shape[0]

        keys = [self._key(v, g) for v, g in zip(videos, video_grid_thw, strict=True)]
        known = self.cache if self.reuse_across_calls and self.use_cache else []
        assignment: list[tuple[str, int | tuple]] = []  # ("new", index into to_encode) or ("known", features)
        to_encode: list[int] = []
        for i, (video, key) in enumerate(zip(videos, keys, strict=True)):
            features = self._find(known, key, video)
            if features is not None:
                assignment.append(("known", features))
                continue
            match = next(
                (j for j, k in enumerate(to_encode) if keys[k] == key and torch.equal(videos[k], video)), None
            )
            if match is None:
                to_encode.append(i)
                match = len(to_encode) - 1
            assignment.append(("new", match))

        encoded: list[tuple[torch.Tensor, ...]] = []
        if to_encode and self.must_hit:
            raise RuntimeError(
                f"{len(to_encode)} of {len(videos)} videos of this forward are not in the frozen vision tower's cache, "
                "which generation filled for this batch. Their inputs differ from generation's (dtype or values), "
                "and encoding them here would run the tower on this rank only (a ZeRO-3 hang)."
            )
        if to_encode:
            everything = to_encode == list(range(len(videos)))  # then the input is already what to encode
            output = self.original(
                pixel_values_videos if everything else torch.cat([videos[i] for i in to_encode]),
                video_grid_thw[to_encode],
                return_dict=True,
                **kwargs,
            )
            encoded = split_features(output)
            self.stats.encoder_runs += 1
            self.stats.rows_encoded += sum(rows[i] for i in to_encode)
            if self.reuse_across_calls and self.use_cache:
                self.cache += [
                    (keys[i], own_copy(videos[i]), tuple(part.detach() for part in parts))
                    for i, parts in zip(to_encode, encoded, strict=True)
                ]
        return self.join_features([encoded[ref] if kind == "new" else ref for kind, ref in assignment])

    def join_features(self, per_video: list[tuple[torch.Tensor, ...]]):
        """The model's own output type from per-video ``(pooler, *deepstack levels)``."""
        pooler = tuple(parts[0] for parts in per_video)
        if not self.deepstack:
            return BaseModelOutputWithPooling(pooler_output=pooler)
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        levels = [tuple(parts[1 + level] for parts in per_video) for level in range(len(per_video[0]) - 1)]
        return BaseModelOutputWithDeepstackFeatures(pooler_output=pooler, deepstack_features=levels)


def own_copy(view: torch.Tensor) -> torch.Tensor:
    """``view`` itself if it spans its whole storage, else a compact copy of it. The cache keeps each video's
    pixels for the exact comparison; a view into the batch's concatenated pixels would keep all of them alive
    (every row's copy, where generation is plain) until the next generation batch."""
    if view.untyped_storage().nbytes() == view.numel() * view.element_size():
        return view
    return view.clone()


def split_features(output) -> list[tuple[torch.Tensor, ...]]:
    """Per video: ``(pooler, *deepstack levels)``. The model consumes DeepStack level k at text layer k, so a
    video's levels must stay with its pooled features wherever they are reused."""
    levels = getattr(output, "deepstack_features", None) or []
    return [tuple(parts) for parts in zip(output.pooler_output, *levels, strict=True)]


def install(model, reuse_across_calls: bool = False, share_cache_with: VideoEncoderOnce | None = None):
    """Install on a model of any supported family (or a PEFT wrapper of one); returns the encoder hook.

    ``share_cache_with``: a reference model whose frozen tower equals the policy's reuses the policy's cache."""
    from video_grpo.inputs.families import detect_family

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hook = VideoEncoderOnce(base.model, reuse_across_calls, deepstack=detect_family(base.config).deepstack)
    if share_cache_with is not None:
        hook.cache = share_cache_with.cache
    return hook
