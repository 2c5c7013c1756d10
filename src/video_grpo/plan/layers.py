"""What one layer costs in activation memory, traced on fake tensors at the real width and token count.

A layer's activation bytes depend on transformers' code (which tensors autograd keeps, what is copied to
float32, how attention converts its mask), on the dtype and on which weights train; they change between
versions. Instead of a table of constants, the planner runs one text layer and one vision block of the real
config, at the step's real sizes, on fake tensors (:mod:`video_grpo.plan.fake_trace`), and counts what they hold:
milliseconds of CPU, no weights, no GPU. Everything else (depth, phases, weights, optimizer states, the KV cache,
the LM head) is composed by :mod:`video_grpo.plan.memory`.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from video_grpo.plan import cache
from video_grpo.plan.model import DEFAULT_LORA_TARGETS, ModelShape, meta_model

if TYPE_CHECKING:  # imported where a layer is traced: a plan whose traces are all cached needs neither
    import torch


@dataclass(frozen=True)
class LayerCost:
    """Bytes one layer adds, by moment (each relative to what was live just before it)."""

    retained: int = 0  # after a forward with grad: what autograd keeps, plus the output
    forward_peak: int = 0  # the most the forward with grad held at any moment
    backward_peak: int = 0  # the most its backward held over retained + the output's gradient
    param_grads: int = 0  # the gradients of its trainable parameters, which stay
    nograd_peak: int = 0  # the most a forward without grad held (old policy, reference, prefill; grad=False)
    output: int = 0  # the output alone

    def scaled(self, count: int) -> LayerCost:
        """``count`` such layers' retained and gradient bytes (peaks are per layer and do not add up)."""
        return LayerCost(
            self.retained * count,
            self.forward_peak,
            self.backward_peak,
            self.param_grads * count,
            self.nograd_peak,
            self.output,
        )


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


def trace(
    call: Callable[[bool], torch.Tensor],
    parameters: list[torch.nn.Parameter],
    grad: bool,
    backward: bool = True,
) -> LayerCost:
    """Run ``call(requires_grad)`` (inputs made inside it) under a :class:`HalfFake` mode already entered by the
    caller, and count: without ``grad``, a forward without grad; with it, a forward with grad and, if
    ``backward``, its backward (each trace runs only what the step's walk reads of it)."""
    import torch

    from video_grpo.runtime.live_memory import LiveBytes

    if not grad:
        with torch.no_grad(), LiveBytes() as nograd:
            call(False)
        return LayerCost(nograd_peak=nograd.peak)
    with LiveBytes() as forward:
        out = call(True)
    out = out[0] if isinstance(out, tuple) else out
    retained, forward_peak, output = forward.current, forward.peak, nbytes(out)
    if not backward or not out.requires_grad:  # not read, or nothing trains and its input needs no gradient
        return LayerCost(retained, forward_peak, output=output)
    with LiveBytes() as counted:
        out.backward(torch.empty_like(out))
    grads = sum(nbytes(p.grad) for p in parameters if p.grad is not None)
    for p in parameters:
        p.grad = None
    return LayerCost(retained, forward_peak, counted.peak, grads, output=output)


def _depth_one(shape: ModelShape, text_kind: str | None = None, full_vision_block: bool = True):
    """A copy of the config cut to one text layer (of ``text_kind``) and one vision block."""
    config = copy.deepcopy(shape.config)
    text = config.get_text_config()
    text.num_hidden_layers = 1
    if text_kind is not None and getattr(text, "layer_types", None):
        text.layer_types = [text_kind]
    vision = config.vision_config
    vision.depth = 1
    if hasattr(vision, "fullatt_block_indexes"):
        vision.fullatt_block_indexes = [0] if full_vision_block else []
    if hasattr(vision, "deepstack_visual_indexes"):
        vision.deepstack_visual_indexes = []
    return config


def _model(config, dtype: torch.dtype, lora_rank: int, lora_targets: tuple[str, ...]):
    model = meta_model(config, dtype)
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        names = {name.rpartition(".")[2] for name, _ in model.named_modules()}
        targets = [t for t in (lora_targets or DEFAULT_LORA_TARGETS) if t in names]
        if (
            not targets
        ):  # this layer kind has none of them (Qwen3.5's Gated DeltaNet): frozen, as PEFT leaves it
            return model.requires_grad_(False)
        with warnings.catch_warnings():
            # PEFT's PeftModel reads transformers' deprecated ``is_gradient_checkpointing`` property whatever it is
            # given (peft_model.py), once per traced layer kind: a library's own deprecation, not a call of ours.
            warnings.filterwarnings(
                "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            model = get_peft_model(
                model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules=targets)
            )
        model = model.get_base_model()
    return model


def _kept(shape: ModelShape, function: Callable[..., LayerCost], *args) -> LayerCost:
    """``function(shape, *args)``, traced once per model and arguments (:mod:`video_grpo.plan.cache`)."""
    name = cache.entry_name(function.__name__, *args)
    return LayerCost(**cache.cached(cache.shape_key(shape), name, lambda: asdict(function(shape, *args))))


@functools.lru_cache(maxsize=64)
def text_layer_cost(
    shape: ModelShape,
    kind: str,
    dtype: str,
    rows: int,
    length: int,
    mask: bool,
    grad: bool,
    lora_rank: int = 0,
    lora_targets: tuple[str, ...] = (),
    input_grad: bool = True,
) -> LayerCost:
    """One decoder layer of ``kind`` on ``rows`` x ``length`` tokens. ``mask``: a 4-D boolean attention mask (the
    packed or padded training rows) instead of plain causal attention (a prefill). ``input_grad``: whether its
    input requires grad (not for LoRA's first layer, whose embedding is frozen, without checkpointing)."""
    return _kept(
        shape, trace_text_layer, kind, dtype, rows, length, mask, grad, lora_rank, lora_targets, input_grad
    )


def trace_text_layer(
    shape: ModelShape,
    kind: str,
    dtype: str,
    rows: int,
    length: int,
    mask: bool,
    grad: bool,
    lora_rank: int,
    lora_targets: tuple[str, ...],
    input_grad: bool,
) -> LayerCost:
    """:func:`text_layer_cost`, traced."""
    import torch

    from video_grpo.plan.fake_trace import HalfFake, fake_parameters

    mode = HalfFake()
    model = _model(_depth_one(shape, kind), getattr(torch, dtype), lora_rank, lora_targets)
    language = model.model.language_model
    fake_parameters(language, mode)
    layer = language.layers[0]
    layer.train()
    if not lora_rank:
        layer.requires_grad_(grad)
    hidden = shape.hidden

    def call(requires_grad: bool):
        states = mode.empty(
            (rows, length, hidden), getattr(torch, dtype), requires_grad=requires_grad and input_grad
        )
        positions = torch.arange(length)[None].expand(3, rows, length)
        embeddings = language.rotary_emb(states, positions)
        return layer(
            hidden_states=states,
            attention_mask=attention,
            position_embeddings=embeddings,
            position_ids=positions,
        )

    with mode:
        # The model makes the 4-D mask once for all its layers (the planner counts it with the forward's inputs),
        # so it is made before the trace counts. A linear-attention layer (Qwen3.5) takes none: its model passes
        # it None when no row is padded.
        attention = (
            torch.ones(rows, 1, length, length, dtype=torch.bool)
            if mask and kind != "linear_attention"
            else None
        )
        return trace(call, [p for p in layer.parameters() if p.requires_grad], grad)


def vision_chunks(shape: ModelShape, grid: tuple[int, int, int], windowed: bool) -> torch.Tensor:
    """``cu_seqlens`` of a vision block: one sequence per frame pair, or Qwen2.5-VL's windows."""
    import torch
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_window_index

    grid_thw = torch.tensor([grid])
    if not windowed:
        return get_vision_cu_seqlens(grid_thw)
    vision = shape.config.vision_config
    return get_vision_window_index(
        grid_thw, vision.spatial_merge_size, vision.window_size, vision.patch_size
    )[1]


@functools.lru_cache(maxsize=64)
def vision_block_cost(
    shape: ModelShape, dtype: str, grid: tuple[int, int, int], windowed: bool, grad: bool
) -> LayerCost:
    """One vision block over one video of ``grid`` (t, h, w patches)."""
    return _kept(shape, trace_vision_block, dtype, grid, windowed, grad)


def trace_vision_block(
    shape: ModelShape, dtype: str, grid: tuple[int, int, int], windowed: bool, grad: bool
) -> LayerCost:
    """:func:`vision_block_cost`, traced."""
    import torch

    from video_grpo.plan.fake_trace import HalfFake, fake_parameters

    mode = HalfFake()
    model = _model(_depth_one(shape, full_vision_block=not windowed), getattr(torch, dtype), 0, ())
    block = model.model.visual.blocks[0]
    fake_parameters(block, mode)
    block.requires_grad_(grad)
    patches = grid[0] * grid[1] * grid[2]
    head_dim = shape.vision_hidden // shape.vision_heads
    chunks = vision_chunks(shape, grid, windowed)

    def call(requires_grad: bool):
        states = mode.empty(
            (patches, shape.vision_hidden), getattr(torch, dtype), requires_grad=requires_grad
        )
        rotary = (
            mode.empty((patches, head_dim), torch.float32),
            mode.empty((patches, head_dim), torch.float32),
        )
        return block(states, cu_seqlens=chunks, position_embeddings=rotary)

    with mode:
        return trace(call, [p for p in block.parameters() if p.requires_grad], grad)


@functools.lru_cache(maxsize=64)
def vision_tower_cost(
    shape: ModelShape,
    dtype: str,
    grid: tuple[int, int, int],
    grad: bool,
    deepstack: bool = False,
    checkpointed: bool = False,
):
    """The vision tower cut to one (frame-attention) block, with one DeepStack merger if ``deepstack``: its stem
    (patch embedding, positions) and merger come out as this minus :func:`vision_block_cost`, one DeepStack
    merger as the difference of the two. ``checkpointed``: the block under gradient checkpointing, which keeps
    its inputs (hidden states and the rotary tables, once for every block) instead of what it saved. The walk
    reads only what its forward keeps and its output, so its backward is not run."""
    return _kept(shape, trace_vision_tower, dtype, grid, grad, deepstack, checkpointed)


def trace_vision_tower(
    shape: ModelShape,
    dtype: str,
    grid: tuple[int, int, int],
    grad: bool,
    deepstack: bool,
    checkpointed: bool,
) -> LayerCost:
    """:func:`vision_tower_cost`, traced."""
    import torch

    from video_grpo.plan.fake_trace import HalfFake, fake_parameters

    mode = HalfFake()
    config = _depth_one(shape)
    if deepstack:
        config.vision_config.deepstack_visual_indexes = [0]  # one DeepStack merger
    model = _model(config, getattr(torch, dtype), 0, ())
    if checkpointed:
        model.train()
        model.activation_checkpointing_enable({"use_reentrant": False})
    visual = model.model.visual
    fake_parameters(visual, mode)
    visual.requires_grad_(grad)
    patches = grid[0] * grid[1] * grid[2]
    pixels = torch.zeros(patches, shape.patch_values, dtype=torch.float32)  # as the processor makes them

    def call(requires_grad: bool):
        # get_video_features casts the pixels to the tower's dtype before the tower runs, in every family
        out = visual(pixels.to(getattr(torch, dtype)), grid_thw=torch.tensor([grid]))
        return out.pooler_output if not deepstack else torch.cat([out.pooler_output, *out.deepstack_features])

    with mode:
        return trace(call, [p for p in visual.parameters() if p.requires_grad], grad, backward=False)
