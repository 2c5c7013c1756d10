"""Measure one GRPO step's memory and FLOPs at full width, with no weights in memory, to check the planner.

The step runs the project's own code (``prefix.pack_rows``, the model's forward with TRL's fused LM head, the
backward, the optimizer) on a model whose parameters and large tensors are *fake*: they carry shape, dtype and
device but no data (``torch._subclasses.fake_tensor``). Small integer tensors (token ids, grids, positions,
segment ids) stay real, so the data-dependent parts (window indices, rotary positions, packing) run as they
do in training. Every storage an operator returns is counted by bytes (as :mod:`video_grpo.runtime.live_memory`), so
the peak of each phase is the peak of live tensor bytes a real run of the same step would hold. What is not
modelled: the allocator's caching and fragmentation, and kernels' workspaces (the planner's headroom).

Each storage is tagged with what it is, for the planner's categories: weights, gradients, optimizer states,
the reference copy, the rollout KV cache, and activations by the region that made them (vision tower,
language model, LM head), forward or backward.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from video_grpo.inputs.families import detect_family
from video_grpo.plan.fake_trace import HalfFake, fake_parameters
from video_grpo.plan.prompt_text import TIME_TEXT_TOKENS


class Regions(TorchFunctionMode):
    """Which part of the model is running: a stack pushed by module forward hooks and, in backward, the region
    whose forward created the autograd node that is running (each node is tagged when it is made)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.backward_region = "other"
        self._tagged: set[int] = set()

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else self.backward_region

    def watch(self, module: torch.nn.Module, region: str) -> None:
        module.register_forward_pre_hook(lambda *_: self.stack.append(region))
        module.register_forward_hook(lambda *_: (self.stack.pop(), None)[1])

    def watch_model(self, model: torch.nn.Module) -> None:
        """The regions of a vision-language model: its own work is the LM head's, its backbone's the language
        model's (embeddings, positions, decoder layers), and video features, from the pixels' cast on, vision."""
        self.watch(model, "head")
        self.watch(model.model, "language")
        self.watch(model.model.visual, "vision")
        features = model.model.get_video_features  # the encode-once hook, or the model's method

        def in_vision(*args, **kwargs):
            with self.entered("vision"):
                return features(*args, **kwargs)

        model.model.get_video_features = in_vision

    @contextlib.contextmanager
    def entered(self, region: str) -> Iterator[None]:
        self.stack.append(region)
        try:
            yield
        finally:
            self.stack.pop()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.stack:
            for value in tree_leaves(out):
                node = getattr(value, "grad_fn", None) if isinstance(value, torch.Tensor) else None
                if node is not None and id(node) not in self._tagged:
                    self._tagged.add(id(node))
                    region = self.stack[-1]
                    node.register_prehook(lambda grads, region=region: self._enter_backward(region))
        return out

    def _enter_backward(self, region: str) -> None:
        self.backward_region = f"{region} backward"


@dataclass
class PhasePeak:
    bytes: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class Ledger(TorchDispatchMode):
    """Live storages by kind (the region that made them, or a kind given by :meth:`mark`); the peak of each
    phase with its breakdown."""

    def __init__(self, regions: Regions) -> None:
        super().__init__()
        self.regions = regions
        self.live: dict[int, tuple[int, str]] = {}  # storage address -> (bytes, kind)
        self.totals: Counter = Counter()  # kind -> live bytes
        self.current = 0
        self.phase: PhasePeak | None = None
        self.peaks: dict[str, PhasePeak] = {}

    def add(self, tensor: torch.Tensor, kind: str) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        size = storage.nbytes()
        self.live[key] = (size, kind)
        self.totals[kind] += size
        self.current += size
        weakref.finalize(storage, self._free, key)
        self._check_peak()

    def _free(self, key: int) -> None:
        size, kind = self.live.pop(key, (0, ""))
        self.totals[kind] -= size
        self.current -= size

    def mark(self, tensors, kind: str) -> None:
        """Name what some tensors are (weights, gradients, optimizer states...), counting them if new."""
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            key = tensor.untyped_storage()._cdata
            if key not in self.live:
                self.add(tensor, kind)
                continue
            size, old = self.live[key]
            if old != kind:
                self.live[key] = (size, kind)
                self.totals[old] -= size
                self.totals[kind] += size
                if self.phase is not None and self.phase.bytes == self.current:  # the peak is now: relabel it
                    self.phase.by_kind = {k: v for k, v in self.totals.items() if v}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        made = [value for value in tree_leaves(out) if isinstance(value, torch.Tensor)]
        if not made:  # most calls inside a fake step are metadata (prim.device, sizes): nothing to count
            return out
        inputs = {
            x.untyped_storage()._cdata for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)
        }
        for value in made:
            if value.untyped_storage()._cdata not in inputs:
                self.add(value, self.regions.current)
        return out

    @contextlib.contextmanager
    def measuring(self, phase: str) -> Iterator[PhasePeak]:
        """Record the peak of live bytes within the block (starting from what is live when it begins)."""
        self.phase = PhasePeak(self.current, {k: v for k, v in self.totals.items() if v})
        try:
            yield self.phase
        finally:
            self.peaks[phase], self.phase = self.phase, None

    def _check_peak(self) -> None:
        if self.phase is not None and self.current > self.phase.bytes:
            self.phase.bytes = self.current
            self.phase.by_kind = {k: v for k, v in self.totals.items() if v}


class Measuring(HalfFake):
    """:class:`HalfFake` with one more rule for the measured step: a new tensor whose values nothing gave it (an
    ``empty``/``zeros``/``full`` buffer, or one ``*_like`` another) and that holds over :data:`BUFFER_BYTES` is made
    fake. HalfFake runs such a buffer for real when it is under 1 GB, and with it every operator on it: TRL's fused
    head projects into a real (tokens x 32,768) tile with ``out=`` and folds it with a dozen real elementwise
    operators per tile, and sums its weight gradient in a real (vocabulary x hidden) fp32 buffer, which at the quick
    grid's widths was about half a cell's CPU time. A buffer's bytes, and the shapes FlopCounterMode counts, are the
    same fake or real (``test_the_fake_measurement_is_the_real_one``); the index arithmetic that needs values (window
    indices, positions, packing) works on tensors far under the threshold. ``buffer_bytes=None``
    (``measure_step(..., buffer_bytes=None)``): HalfFake's rule alone, the measurement as it was before (the quick
    cells' bytes, breakdowns and FLOPs were identical both ways)."""

    def __init__(self, buffer_bytes: int | None = None) -> None:
        super().__init__()
        self.buffer_bytes = buffer_bytes
        self.fake_buffers = 0  # how many buffers this rule made fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.buffer_bytes is not None and func in NEW_BUFFERS:
            with self.fake:
                probe = func(*args, **kwargs)
            if isinstance(probe, torch.Tensor) and probe.untyped_storage().nbytes() > self.buffer_bytes:
                self.fake_buffers += 1
                return probe
        return super().__torch_dispatch__(func, types, args, kwargs)


_aten = torch.ops.aten
# operators whose output's values do not depend on their inputs' values (only shapes, dtypes and constants)
NEW_BUFFERS = {
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.zeros.default,
    _aten.ones.default,
    _aten.full.default,
    _aten.empty_like.default,
    _aten.zeros_like.default,
    _aten.ones_like.default,
    _aten.full_like.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
    _aten.new_zeros.default,
    _aten.new_ones.default,
    _aten.new_full.default,
}
BUFFER_BYTES = 16 << 20  # index arithmetic's tensors stay far under this; TRL's head tiles are 30 MB and up


# -- one step -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSetting:
    """One measured GRPO step on one process: one prompt's group of ``group_size`` answers of ``answer_tokens``
    each, as one micro-batch (``per_device_train_batch_size`` = G, ``steps_per_generation`` 1)."""

    config: dict  # a published config.json's values, depth already cut
    visual_tokens: int = 2048
    group_size: int = 8
    answer_tokens: int = 128
    text_tokens: int = 160  # the prompt's text around the video (Qwen3 families add their time text)
    shared_prefix: bool = True
    gradient_checkpointing: bool = False
    training: str = "full"  # "full", "lora" or "frozen_tower"
    lora_rank: int = 64
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    dtype: str = "bfloat16"
    beta: float = 0.0
    old_policy_pass: bool = False


def build_config(values: dict):
    from transformers import AutoConfig

    values = dict(values)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def video_grid(visual_tokens: int, merge: int = 2) -> tuple[int, int, int]:
    """A (t, h, w) patch grid with ``visual_tokens`` language-model tokens: square frames, 8 temporal patches when
    the count allows, else the nearest count that does (1,024 tokens: 16 of 8 x 8; 4,096: 16 of 16 x 16), else one
    token per frame."""
    for frames in (8, 16, 4, 32, 2, 64, 1):
        per_frame, rest = divmod(visual_tokens, frames)
        side = round(per_frame**0.5)
        if not rest and side * side == per_frame:
            return frames, side * merge, side * merge
    return visual_tokens, merge, merge


def step_inputs(config, setting: StepSetting) -> dict:
    """Token ids (left-padded prompt, right-padded answers), per-row video inputs and the sizes that define them.

    The prompt is ``text_tokens / 2`` text tokens, the video block, then the rest of the text; every answer is
    ``answer_tokens`` long (the planner's worst case). Pixels are real, so identical-video checks run as in
    training."""
    text = config.get_text_config()
    merge = config.vision_config.spatial_merge_size
    t, h, w = video_grid(setting.visual_tokens, merge)
    patch = config.vision_config.patch_size
    channels = 3 * config.vision_config.temporal_patch_size * patch * patch
    frame = [config.video_token_id] * (h * w // merge**2)
    if detect_family(config).time_in_text:  # "<t seconds>" text, then the frame's block, per temporal patch
        block = (
            [13] * TIME_TEXT_TOKENS + [config.vision_start_token_id] + frame + [config.vision_end_token_id]
        )
        video = block * t
    else:
        video = [config.vision_start_token_id] + frame * t + [config.vision_end_token_id]
    before = setting.text_tokens // 2
    prompt = [11] * before + video + [12] * (setting.text_tokens - before)
    answers = torch.randint(
        100, min(30000, text.vocab_size - 100), (setting.group_size, setting.answer_tokens)
    )
    ids = torch.cat([torch.tensor(prompt).repeat(setting.group_size, 1), answers], dim=1)
    pixels = torch.zeros(t * h * w, channels)
    rows = {
        "video_pixels": [pixels] * setting.group_size,
        "video_grid_thw": torch.tensor([[t, h, w]] * setting.group_size),
    }
    if config.model_type == "qwen2_5_vl":
        rows["second_per_grid_ts"] = torch.ones(setting.group_size)
    mask = torch.ones_like(ids)
    mask[-1, -1] = 0  # one answer a token short, as in any real batch: the rows are padded
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "completion_length": setting.answer_tokens,
        "video_rows": rows,
        "prompt_tokens": len(prompt),
    }


def flop_counter():
    """torch's FlopCounterMode, taught the CPU's flash-attention operators (the formulas of the CUDA ones) and a
    grouped convolution's weight gradient."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def convolution_backward(grad_out, x, w, *args, out_shape=None, **kwargs) -> int:
        # torch's formula counts the weight gradient as an ungrouped convolution of the input with the output's
        # gradient: ``groups`` times too many FLOPs for a grouped one (Qwen3.5's depthwise causal convolution over
        # 8,192 channels: 5.4 of a step's 34.4 TFLOP, against 0.03 for its forward). It is the forward's count.
        transposed, output_mask = args[4], args[7]
        count = 0
        if output_mask[0]:
            count += fc.conv_flop_count(grad_out, w, fc.get_shape(out_shape[0]), not transposed)
        if output_mask[1]:
            count += fc.conv_flop_count(x, w, grad_out, transposed)
        return count

    mapping = {  # FlopCounterMode hands these the shapes of their tensor arguments
        aten.convolution_backward: convolution_backward,
        # TRL's fused LM head accumulates its gradients with in-place addmm_, which the counter leaves out
        aten.addmm_: lambda acc, a, b, *args, out_shape=None, **kwargs: fc.addmm_flop(acc, a, b),
        aten._scaled_dot_product_flash_attention_for_cpu: (
            lambda q, k, v, *args, out_shape=None, **kwargs: fc.sdpa_flop_count(q, k, v)
        ),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: (
            lambda grad, q, k, v, *args, out_shape=None, **kwargs: fc.sdpa_backward_flop_count(grad, q, k, v)
        ),
    }
    counter = fc.FlopCounterMode(display=False, custom_mapping=mapping)
    counter.mod_tracker = WholeStepOnly()
    return counter


class WholeStepOnly:
    """Stands in for FlopCounterMode's ModuleTracker, which files FLOPs by module: its hooks keep every
    checkpointed layer's recomputed tensors alive until the backward ends (measured: ~470 MB per layer of a
    Qwen3-VL-4B step at 2,750 tokens), memory a training run does not hold. The totals need no modules."""

    parents = frozenset({"Global"})

    def __enter__(self) -> WholeStepOnly:
        return self

    def __exit__(self, *args) -> None:
        return None


@dataclass
class StepMeasurement:
    peaks: dict[str, PhasePeak]  # phase -> peak live bytes and its breakdown by kind
    flops: dict[str, int]  # phase -> FLOPs counted by torch's FlopCounterMode
    prompt_tokens: int
    packed_positions: int  # token positions of the old/ref/loss forwards (packed or plain)
    fake_buffers: int = 0  # new buffers made fake by :class:`Measuring`'s rule (0 on real tensors)


@contextlib.contextmanager
def cache_updates_as(regions: Regions) -> Iterator[None]:
    """Within the block, allocations of the KV cache's update and row selection count as "kv cache"."""
    from transformers.cache_utils import DynamicLayer

    originals = {name: getattr(DynamicLayer, name) for name in ("update", "batch_select_indices")}

    def wrap(original):
        def wrapped(self, *args, **kwargs):
            with regions.entered("kv cache"):
                return original(self, *args, **kwargs)

        return wrapped

    for name, original in originals.items():
        setattr(DynamicLayer, name, wrap(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(DynamicLayer, name, original)


def build_policy(config, setting: StepSetting, mode: HalfFake | None):
    """The policy as the trainer holds it: fused LM head, encode-once hook, LoRA / frozen tower, checkpointing.
    With ``mode`` None its weights are real (random), for checking the fake measurement against a real one."""
    from transformers import AutoModelForImageTextToText
    from trl.trainer.utils import add_fused_lm_head

    from video_grpo.inputs import positions
    from video_grpo.inputs.encoder import install

    positions.install()
    dtype = getattr(torch, setting.dtype)
    with torch.device("meta") if mode is not None else contextlib.nullcontext():
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    add_fused_lm_head(model)  # before PEFT wraps the model, as TRL does
    if setting.training == "frozen_tower":
        model.model.visual.requires_grad_(False)
    if setting.training == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=setting.lora_rank, lora_alpha=2 * setting.lora_rank, target_modules=list(setting.lora_targets)
        )
        model = get_peft_model(model, lora)
    if mode is not None:
        fake_parameters(model, mode)
    if setting.gradient_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    frozen = not any(p.requires_grad for p in base.model.visual.parameters())
    install(model, reuse_across_calls=frozen)  # as the trainer does: a frozen tower's features are kept
    return model


def packed_or_plain(model, config, inputs: dict, shared: bool, regions: Regions) -> tuple[dict, torch.Tensor]:
    """The loss-side forward's model inputs and shifted labels, as the trainer builds them."""
    from video_grpo.inputs.prefix import forkable_state, pack_rows
    from video_grpo.inputs.processing import video_kwargs

    ids, mask, width = inputs["input_ids"], inputs["attention_mask"], inputs["completion_length"]
    if shared:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        packed = pack_rows(
            ids,
            mask,
            width,
            inputs["video_rows"],
            slice(None),
            base.model.get_rope_index,
            config.video_token_id,
            0,
            fork_state=forkable_state(config),
        )
        return packed.model_inputs, packed.shift_labels
    with regions.entered("vision inputs"):  # one copy of the pixels per row
        video = video_kwargs(inputs["video_rows"], slice(None), ids, config.video_token_id)
    model_inputs = {"input_ids": ids, "attention_mask": mask, **video}
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-width] = -100
    return model_inputs, torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)


def answer_logps(model, model_inputs: dict, labels: torch.Tensor) -> torch.Tensor:
    """The answer tokens' log-probs through TRL's fused head, as the trainer scores them."""
    out = model(**model_inputs, shift_labels=labels, fused_lm_head=True)
    return out.log_probs[labels != -100]  # the scored answer tokens, flat


def generate(model, config, inputs: dict, setting: StepSetting, regions: Regions) -> None:
    """What generation holds: the prompt's prefill (once, then its cache copied to the G rows, with
    ``shared_prefix``; else G rows), then one forward per new token on the growing cache."""
    from video_grpo.rollout.prefill import select_cache_rows

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = base.model
    prompt = inputs["prompt_tokens"]
    rows, width = setting.group_size, setting.answer_tokens
    ids = inputs["input_ids"][:, :prompt]
    video = inputs["video_rows"]
    time = {key: video[key] for key in ("second_per_grid_ts",) if key in video}
    types = (ids == config.video_token_id).long() * 2
    if setting.shared_prefix:
        cache = backbone(
            input_ids=ids[:1, :-1],
            attention_mask=torch.ones(1, prompt - 1, dtype=torch.long),
            pixel_values_videos=video["video_pixels"][0],
            video_grid_thw=video["video_grid_thw"][:1],
            mm_token_type_ids=types[:1, :-1],
            **{key: value[:1] for key, value in time.items()},
            use_cache=True,
        ).cache
        index = torch.zeros(rows, dtype=torch.long)
        select_cache_rows(cache, index)
        backbone.rope_deltas = backbone.rope_deltas[index]
        steps = width
    else:
        with regions.entered("vision inputs"):
            pixels = torch.cat(video["video_pixels"])  # one copy per row: the plain generate's input
        out = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values_videos=pixels,
            video_grid_thw=video["video_grid_thw"],
            mm_token_type_ids=types,
            **time,
            use_cache=True,
            logits_to_keep=1,
        )
        cache, steps = out.cache, width - 1
        out.logits.float().argmax(-1)
        del out
    for _ in range(steps):
        out = model(  # no padding here: positions continue from the cache and the prompt's rope deltas
            input_ids=torch.zeros(rows, 1, dtype=torch.long),
            mm_token_type_ids=torch.zeros(rows, 1, dtype=torch.long),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        out.logits.float().softmax(-1)  # the sampler's (rows, vocab) probabilities
        del out


def measure_step(
    setting: StepSetting, fake: bool = True, buffer_bytes: int | None = BUFFER_BYTES
) -> StepMeasurement:
    """Run one GRPO step of ``setting`` with fake weights (``fake=False``: real random weights and real tensors,
    as small models allow); the peak live bytes and FLOPs of each phase. ``buffer_bytes``: new buffers over this
    many bytes are fake too (:class:`Measuring`; None: only HalfFake's rule)."""
    from video_grpo.loss.grpo_math import grpo_loss

    config = build_config(setting.config)
    mode, regions = (Measuring(buffer_bytes) if fake else None), Regions()
    ledger = Ledger(regions)
    policy = build_policy(config, setting, mode)
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    regions.watch_model(base)
    reference = None
    if setting.beta and setting.training != "lora":  # LoRA's reference is the adapter switched off
        reference = build_policy(
            config, replace_setting(setting, training="full", gradient_checkpointing=False), mode
        )
        reference.requires_grad_(False)
        reference.eval()
        regions.watch_model(reference)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    inputs = step_inputs(config, setting)
    flops: dict[str, int] = {}
    with regions, mode or contextlib.nullcontext(), ledger:
        ledger.mark(list(policy.parameters()) + list(policy.buffers()), "weights")
        ledger.mark([inputs["video_rows"]["video_pixels"][0]], "vision inputs")  # the rows' processed pixels
        if reference is not None:
            ledger.mark(list(reference.parameters()) + list(reference.buffers()), "reference")
        optimizer = torch.optim.AdamW(trainable, lr=1e-6, fused=True)  # the Trainer's adamw_torch_fused
        for (
            parameter
        ) in trainable:  # a first step makes the optimizer's states: a step in the middle of training
            parameter.grad = torch.zeros_like(parameter)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ledger.mark([v for state in optimizer.state.values() for v in state.values()], "optimizer states")
        for parameter in trainable:
            parameter.register_post_accumulate_grad_hook(lambda p: ledger.mark([p.grad], "gradients"))

        policy.eval()
        with (
            torch.no_grad(),
            ledger.measuring("generation"),
            cache_updates_as(regions),
            flop_counter() as count,
        ):
            generate(policy, config, inputs, setting, regions)
        flops["generation"] = count.get_total_flops()
        policy.train()

        def scored(model):  # the trainer builds each forward's inputs (packed or plain) when it runs it
            model_inputs, labels = packed_or_plain(policy, config, inputs, setting.shared_prefix, regions)
            return answer_logps(model, model_inputs, labels)

        old = ref = None
        with torch.no_grad(), ledger.measuring("old_and_reference"), flop_counter() as count:
            if setting.old_policy_pass:
                old = scored(policy)
            if setting.beta:
                adapter_off = policy.disable_adapter() if reference is None else contextlib.nullcontext()
                with adapter_off:
                    ref = scored(reference or policy)
        flops["old_and_reference"] = count.get_total_flops()

        with ledger.measuring("loss"), flop_counter() as count:
            logps = scored(policy)
            advantages = torch.linspace(-1, 1, logps.numel())
            loss = grpo_loss(
                logps[None],
                (logps.detach() if old is None else old)[None],
                advantages[:1],
                torch.ones(1, logps.numel()),
                beta=setting.beta,
                ref_per_token_logps=None if ref is None else ref[None],
            )
            loss.backward()
            del logps, loss
        flops["loss"] = count.get_total_flops()

        with ledger.measuring("optimizer"), regions.entered("optimizer"), flop_counter() as count:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        flops["optimizer"] = count.get_total_flops()
    model_inputs, _ = packed_or_plain(policy, config, inputs, setting.shared_prefix, regions)
    return StepMeasurement(
        ledger.peaks,
        flops,
        inputs["prompt_tokens"],
        int(model_inputs["input_ids"].numel()),
        mode.fake_buffers if mode is not None else 0,
    )


def replace_setting(setting: StepSetting, **changes) -> StepSetting:
    import dataclasses

    return dataclasses.replace(setting, **changes)


PLAN_CATEGORY = {  # what the ledger's kinds are in the planner's categories
    "weights": "weights",
    "reference": "reference",
    "gradients": "gradients",
    "optimizer states": "optimizer states",
    "optimizer": "optimizer states",
    "kv cache": "kv cache",
    "vision": "vision activations",
    "vision inputs": "vision activations",
    "head": "logits and log-probs",
}


def plan_categories(by_kind: dict[str, int]) -> dict[str, int]:
    """A measured breakdown in the planner's categories (backward work counts with its forward's region; what no
    region made, such as ids, positions and masks, with the language model)."""
    out: Counter = Counter()
    for kind, size in by_kind.items():
        out[PLAN_CATEGORY.get(kind.removesuffix(" backward"), "lm activations")] += size
    return dict(out)
