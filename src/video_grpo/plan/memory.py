"""GPU memory of one GRPO step, by phase and by category, composed from the model's sizes and traced layer costs.

The step is walked in the order it runs, keeping a ledger of what is alive: generation (prefill, the KV cache
copied to the G rows, decoding), the old-policy and reference forwards, the loss forward and backward of one
micro-batch, the optimizer step. Each phase reports its peak and what it is made of:

- ``weights``: the policy's parameters (ZeRO-3: this rank's shard, plus the full copy gathered to generate);
- ``gradients``, ``optimizer states`` (nothing on the GPU when offloaded), ``reference`` (a copy for beta > 0;
  LoRA's reference is the adapter switched off, no copy);
- ``deepspeed buffers``: DeepSpeed's own, besides the model states (:mod:`video_grpo.plan.deepspeed_buffers`): the
  gradient reduce bucket (ZeRO-1/2: during each backward; ZeRO-3: all step) and the optimizer step's float32
  gradient partition;
- ``kv cache`` (with ``decode_compile``'s CUDA graphs, the static cache all step); ``vision activations`` (pixels, the tower's saved tensors, cached features);
  ``lm activations`` (embeddings, masks, the decoder layers' saved tensors); ``logits and log-probs`` (the LM
  head's buffers, TRL's fused head on both paths);
- ``held batches`` (a plan for the CPU only, where they are device memory; on a GPU they stay in host memory):
  the decoded frames of the batch being trained on, uint8, alive all step, and the previous generation batch's
  pixels, which TRL keeps buffered until the next batch has been generated and scored (generation and the
  old-policy/reference phase).

Layer activations come from :mod:`video_grpo.plan.layers` (traced at the real sizes); the rest is arithmetic here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from video_grpo.plan.deepspeed_buffers import deepspeed_buffers
from video_grpo.plan.layers import LayerCost, text_layer_cost, vision_block_cost, vision_tower_cost
from video_grpo.plan.model import DEFAULT_LORA_TARGETS, ModelShape
from video_grpo.plan.sizes import DTYPE_BYTES, step_sizes
from video_grpo.plan.workload import Workload, decode_path

CATEGORIES = (
    "weights",
    "gradients",
    "optimizer states",
    "deepspeed buffers",
    "reference",
    "kv cache",
    "vision activations",
    "lm activations",
    "logits and log-probs",
    "held batches",
)
PHASES = ("generation", "old_and_reference", "loss", "optimizer")
CATEGORY_OF = {"logits": "logits and log-probs"}
TOKEN_TILE, VOCAB_TILE = 4096, 32768  # TRL's fused LM head: tokens x vocabulary per projection tile
CPU_TILE_COPIES = 7  # float32 tile-sized temporaries of TRL's torch fallback (no Triton) in its backward
PIXEL_BYTES = 4  # the processor's pixels stay float32 on every path (processing's dtype policy)
FRAME_BYTES = 1  # decoded frames are uint8, resized to the processor's grid: one byte per patch value


@dataclass
class PhaseMemory:
    peak: int = 0
    by_category: dict[str, int] = field(default_factory=dict)


@dataclass
class MemoryPlan:
    phases: dict[str, PhaseMemory]
    host_bytes: int = 0  # offloaded optimizer states and parameters, in CPU RAM per process

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda name: self.phases[name].peak)

    @property
    def peak(self) -> int:
        return self.phases[self.peak_phase].peak

    @property
    def peak_category(self) -> str:
        categories = self.phases[self.peak_phase].by_category
        return max(categories, key=categories.get)


class Ledger:
    """Live bytes by category; :meth:`moment` records a candidate peak of the current phase (with transients)."""

    def __init__(self) -> None:
        self.live: Counter = Counter()
        self.phase = PhaseMemory()

    def moment(self, **transient: int) -> None:
        """Record the live bytes plus ``transient`` ones (keyword = category with ``_`` for spaces, ``logits``
        for "logits and log-probs") as the phase's peak if they are more than any moment before."""
        now = self.live + Counter(
            {CATEGORY_OF.get(k, k.replace("_", " ")): v for k, v in transient.items() if v}
        )
        total = sum(now.values())
        if total > self.phase.peak:
            self.phase = PhaseMemory(total, {k: v for k, v in now.items() if v})

    def take_phase(self) -> PhaseMemory:
        phase, self.phase = self.phase, PhaseMemory()
        return phase


def model_states(shape: ModelShape, work: Workload) -> dict[str, int]:
    """Per-GPU bytes of weights, reference, gradients and optimizer states, and the host RAM of offloading.

    DeepSpeed (ZeRO stage >= 1, bf16): 2 bytes of weights, 2 of gradients and 12 of optimizer state (float32
    master weights and Adam's two moments) per parameter; stage 1 shards the 12, stage 2 also the gradients,
    stage 3 also the weights. Without DeepSpeed: gradients and Adam's moments in the weights' dtype."""
    b = DTYPE_BYTES[work.dtype]
    n = max(1, work.num_processes)
    trainable = trainable_params(shape, work)
    weights = shape.params * b / (n if work.zero_stage == 3 else 1)
    if work.offload_params and work.zero_stage == 3:
        weights = 0
    reference = (
        0
        if (not work.beta or work.training == "lora")
        else shape.params * b / (n if work.zero_stage == 3 else 1)
    )
    # PEFT keeps LoRA adapters in float32 (autocast_adapter_dtype); DeepSpeed's bf16 engine casts every weight
    lora = work.training == "lora"
    trained_bytes = 4 if lora else b
    if work.zero_stage >= 1:
        grads = trainable * 2 / (n if work.zero_stage >= 2 else 1)
        states = trainable * 12 / n
    else:
        grads = trainable * trained_bytes
        states = trainable * 2 * trained_bytes
    host = 0
    if work.offload_optimizer:
        host, states = states, 0
    if work.offload_params and work.zero_stage == 3:
        host += shape.params * b / n
    if lora:  # the adapters are weights besides the model's
        weights += trainable * (2 if work.zero_stage >= 1 else 4)
    return {
        "weights": int(weights),
        "reference": int(reference),
        "gradients": int(grads),
        "optimizer states": int(states),
        "host": int(host),
    }


def lora_params(shape: ModelShape, work: Workload) -> int:
    return shape.lora_params(work.lora_rank, work.lora_targets or DEFAULT_LORA_TARGETS)


def trainable_params(shape: ModelShape, work: Workload) -> int:
    if work.training == "lora":
        return lora_params(shape, work)
    if work.training == "frozen_tower":
        return shape.params - shape.vision_params
    return shape.params


def head_trains(work: Workload) -> bool:
    return work.training != "lora"


def head_buffers(shape: ModelShape, work: Workload, positions: int) -> tuple[int, int]:
    """(the projection buffer, one float32 tile) of TRL's fused LM head over ``positions``: the buffer is
    (up to 4,096 tokens) x 32,768 in the compute dtype whatever the vocabulary; a tile is its used part."""
    rows = min(positions, TOKEN_TILE)
    return rows * VOCAB_TILE * DTYPE_BYTES[work.dtype], rows * min(shape.vocab, VOCAB_TILE) * 4


def head_forward(shape: ModelShape, work: Workload, tokens: int, scored: int, device: str) -> tuple[int, int]:
    """(saved, transient peak) bytes of TRL's fused LM head forward over a forward's ``tokens`` positions.

    On a GPU with Triton only the ``scored`` answer positions are projected, and their hidden states are gathered
    (a copy, kept for backward); the torch fallback (CPU) projects every position. Per token it keeps seven
    float32 running statistics."""
    b = DTYPE_BYTES[work.dtype]
    n = scored if device != "cpu" else tokens
    saved = (n * shape.hidden * b if device != "cpu" else 0) + n * 4 * 2  # gathered hidden; log Z, log-probs
    buffer, tile = head_buffers(shape, work, n)
    # the torch fallback (CPU) also holds the tile in float32, z - max and its exp
    return saved, n * 4 * 7 + buffer + (3 * tile if device == "cpu" else 0)


def head_backward(shape: ModelShape, work: Workload, tokens: int, scored: int, device: str) -> int:
    """Peak bytes of the fused head's backward: float32 gradients of the hidden states and of the vocabulary
    projection (when it trains), their casts to the model's dtype, and the projection buffer (the torch fallback
    on CPU holds several float32 tiles besides)."""
    b = DTYPE_BYTES[work.dtype]
    n = scored if device != "cpu" else tokens
    weight = shape.vocab * shape.hidden if head_trains(work) else 0
    buffer, tile = head_buffers(shape, work, n)
    cpu_tiles = (
        CPU_TILE_COPIES * tile + tile // 4 if device == "cpu" else 0
    )  # float32 tiles and a boolean one
    during = n * shape.hidden * 4 + weight * 4 + buffer + cpu_tiles
    casts = n * shape.hidden * (4 + b) + weight * (4 + b)  # float32 accumulators and their casts, both alive
    return max(during, casts)


def plan_memory(shape: ModelShape, work: Workload, device: str = "cuda") -> MemoryPlan:
    """The per-GPU memory of one step of ``work`` on ``shape``. ``device="cpu"`` models the CPU kernels (TRL's
    torch fallback for the LM head) and keeps the rows' pixels resident, as tests and benchmarks run them; there
    the batches the trainer holds in host memory are device memory too (``held batches``)."""
    return StepWalk(shape, work, device).run()


class StepWalk:
    """The step in the order it runs, with a :class:`Ledger` of what is alive."""

    def __init__(self, shape: ModelShape, work: Workload, device: str) -> None:
        self.shape, self.work, self.device = shape, work, device
        self.b = DTYPE_BYTES[work.dtype]
        self.sizes = step_sizes(shape, work)
        self.states = model_states(shape, work)
        self.deepspeed = deepspeed_buffers(work, trainable_params(shape, work))
        self.ledger = Ledger()
        self.tower_trains = work.training == "full"
        self.cached = (
            not self.tower_trains and work.encode_once
        )  # a frozen tower's features live through the batch
        self.lora = (work.lora_rank, work.lora_targets) if work.training == "lora" else (0, ())
        self.kinds = Counter(shape.text_layers)
        sizes = self.sizes
        self.pixels = sizes.generation_videos * sizes.patches * shape.patch_values * PIXEL_BYTES
        visual_tokens = sizes.patches // shape.merge**2
        self.features = (
            sizes.generation_videos * visual_tokens * shape.out_hidden * self.b * (1 + shape.deepstack_levels)
        )
        # the compiled decoder's static cache (video_grpo.rollout.decode): every generation row x its whole length; with
        # CUDA graphs it stays allocated all step (its addresses are baked into the graph)
        self.decode_path = decode_path(work, device)
        self.static_cache = sizes.generation_rows * (
            work.decode_cache_tokens * shape.kv_bytes_per_token(self.b) + shape.linear_state_bytes()
        )
        self.persistent_cache = self.static_cache if self.decode_path == "compiled_cuda_graphs" else 0
        # on the CPU, host memory is the device's: the batch's decoded frames (one uint8 value per patch value,
        # each distinct video once) all step, and the previous generation batch's pixels, buffered by TRL until
        # the next batch has been generated and scored (the same size as this one's: the plan's sizes)
        on_cpu = device == "cpu"
        self.frames = (
            sizes.generation_videos * sizes.patches * shape.patch_values * FRAME_BYTES if on_cpu else 0
        )
        self.previous_pixels = self.pixels if on_cpu else 0

    def run(self) -> MemoryPlan:
        live = self.ledger.live
        live.update(
            {k: v for k, v in self.states.items() if k in ("weights", "reference", "optimizer states")}
        )
        if self.device == "cpu":
            live["vision activations"] += self.pixels  # the rows' processed pixels, on the device all along
        live["kv cache"] = self.persistent_cache
        live["deepspeed buffers"] = self.deepspeed.persistent
        live["held batches"] = self.frames + self.previous_pixels
        phases = {"generation": self.generation(), "old_and_reference": self.old_and_reference()}
        live["held batches"] -= self.previous_pixels  # the new batch replaced it in TRL's buffer
        phases.update(loss=self.loss(), optimizer=self.optimizer())
        return MemoryPlan(phases, host_bytes=self.states["host"])

    def text_layer(
        self, kind: str, rows: int, length: int, mask: bool, grad: bool, input_grad: bool = True
    ) -> LayerCost:
        return text_layer_cost(
            self.shape, kind, self.work.dtype, rows, length, mask, grad, *self.lora, input_grad=input_grad
        )

    def generation(self) -> PhaseMemory:
        shape, work, sizes, ledger, b = self.shape, self.work, self.sizes, self.ledger, self.b
        ledger.moment()
        if work.zero_stage == 3 and work.gather_for_generation:  # the whole policy gathered on every rank
            ledger.live["weights"] += int(shape.params * b * (1 - 1 / max(1, work.num_processes)))
        else:  # ZeRO-3 without it gathers as it goes, as in training
            ledger.live["weights"] += self.zero3_gathered()
        # generation's input: each distinct video once with one prefill per prompt, else one copy per row (and on
        # the CPU the rows' own pixels are there besides)
        rows_per_video = max(1, sizes.generation_rows // max(1, sizes.generation_videos))
        copies = (0 if self.device == "cpu" else 1) if work.shared_prefix else rows_per_video
        ledger.live["vision activations"] += copies * self.pixels
        videos = sizes.generation_videos
        shared = work.shared_prefix
        compiled = self.decode_path != "eager"
        if shared:  # one prefill per prompt, without its last token
            rows, length = videos, sizes.prompt - 1
        else:  # every row; the compiled path also leaves the last token to the decoder
            rows, length = sizes.generation_rows, sizes.prompt - int(compiled)
        tower = vision_tower_cost(shape, work.dtype, sizes.grid, False)
        encoded = (
            videos if work.encode_once else sizes.generation_rows
        )  # without encode-once, every row's copy
        # the token embeddings are made before the video features
        ledger.moment(
            vision_activations=tower.nograd_peak * encoded, lm_activations=rows * length * shape.hidden * b
        )
        features = self.features * (1 if shared else sizes.generation_rows // max(1, videos))
        if self.cached:
            ledger.live["vision activations"] += self.features  # the frozen tower's cache, kept for the batch
        kv_token = shape.kv_bytes_per_token(b)
        layers = max(1, len(shape.text_layers))
        embeddings = (
            2 * rows * length * shape.hidden * b
        )  # the token embeddings, then with the video scattered in
        for kind, count in self.kinds.items():
            layer = self.text_layer(kind, rows, length, False, False)
            for _ in range(count):
                ledger.moment(lm_activations=embeddings + layer.nograd_peak, vision_activations=features)
                ledger.live["kv cache"] += rows * length * kv_token // layers
        prefilled = rows * length * kv_token + rows * shape.linear_state_bytes()
        ledger.live["kv cache"] = self.persistent_cache + prefilled
        ledger.moment(lm_activations=embeddings, vision_activations=features)
        rows = sizes.generation_rows
        logits = rows * shape.vocab * (b + 4 + 4)  # the sampler's float32 logits and probabilities
        if compiled:
            # the prefill's cache copied into the static one layer by layer, each prefill layer freed once copied:
            # at most the whole static cache and one prefill layer; decoding then writes in place
            ledger.live["kv cache"] = self.static_cache
            ledger.moment(kv_cache=prefilled // layers)
            ledger.moment(logits=logits)
        else:
            if shared:  # the prompt's cache copied to the G rows, one layer at a time
                ledger.live["kv cache"] = rows * length * kv_token + rows * shape.linear_state_bytes()
            final = rows * (sizes.prompt - 1 + sizes.answer) * kv_token + rows * shape.linear_state_bytes()
            ledger.live["kv cache"] = final
            # the last token: one layer's cache grown by a copy, and the sampler's logits
            ledger.moment(kv_cache=final // layers, logits=logits)
        phase = ledger.take_phase()
        ledger.live["kv cache"] = self.persistent_cache
        ledger.live["weights"] = self.states["weights"] + self.zero3_gathered()
        ledger.live["vision activations"] -= copies * self.pixels
        if self.cached and self.device != "cpu":
            ledger.live["vision activations"] += self.pixels  # the cache keeps the pixels to compare against
        return phase

    def forward_inputs(self) -> int:
        """Embeddings (twice: before and after the video is scattered in), the attention mask, ids, positions and
        the pixels of a loss-shaped forward (one copy per row on the plain path; packed, one per prompt, which on
        the CPU is the rows' own tensor when the micro-batch has one prompt)."""
        sizes, shape, work = self.sizes, self.shape, self.work
        tokens = sizes.loss_rows * sizes.loss_length
        mask = sizes.loss_rows * sizes.loss_length**2  # boolean; packed rows, or padded plain rows
        video = sizes.patches * shape.patch_values * PIXEL_BYTES
        if not work.shared_prefix:
            pixels = work.micro_batch_rows * video
        else:
            pixels = 0 if (self.device == "cpu" and sizes.loss_videos == 1) else sizes.loss_videos * video
        return 2 * tokens * shape.hidden * self.b + mask + tokens * 8 * 4 + pixels

    def zero3_gathered(self) -> int:
        """ZeRO-3 gathers each module's weights when it runs; the largest at once is the vocabulary projection
        (or embedding), gathered for the LM head, with the next layer prefetched."""
        work, shape = self.work, self.shape
        if work.zero_stage != 3:
            return 0
        largest_layer = max(shape.text_layer_params.values())
        return (shape.largest_layer_params + largest_layer) * self.b

    def kept_inputs(self) -> int:
        sizes = self.sizes
        tokens = sizes.loss_rows * sizes.loss_length
        return sizes.loss_rows * sizes.loss_length**2 + tokens * self.shape.hidden + tokens * 8 * 4

    def old_and_reference(self) -> PhaseMemory:
        shape, work, sizes, ledger = self.shape, self.work, self.sizes, self.ledger
        ledger.moment()
        forwards = int(work.old_policy_pass) + int(bool(work.beta))
        tokens = sizes.loss_rows * sizes.loss_length
        if forwards:
            ledger.live["logits and log-probs"] += forwards * sizes.generation_rows * sizes.answer * 4
            pixels = sizes.loss_videos * sizes.patches * shape.patch_values * PIXEL_BYTES
            inputs = self.forward_inputs()
            if not self.cached:
                tower = vision_tower_cost(shape, work.dtype, sizes.grid, False)
                on_device = pixels if self.device != "cpu" else 0
                ledger.moment(vision_activations=on_device + tower.nograd_peak * sizes.loss_videos)
            for kind in self.kinds:
                layer = self.text_layer(kind, sizes.loss_rows, sizes.loss_length, True, False)
                ledger.moment(lm_activations=inputs + layer.nograd_peak)
            saved, transient = head_forward(shape, work, tokens, sizes.scored, self.device)
            ledger.moment(lm_activations=inputs, logits=saved + transient)
        return ledger.take_phase()

    def loss(self) -> PhaseMemory:
        shape, work, sizes, ledger, b = self.shape, self.work, self.sizes, self.ledger, self.b
        live = ledger.live
        grads_before = (
            self.states["gradients"] if work.gradient_accumulation > 1 or work.zero_stage >= 1 else 0
        )
        live["gradients"] = grads_before
        ledger.moment()
        videos = sizes.loss_videos
        vision_saved = 0
        if self.tower_trains:
            if self.device != "cpu":
                live["vision activations"] += videos * sizes.patches * shape.patch_values * PIXEL_BYTES
            checkpointed = work.gradient_checkpointing
            tower = vision_tower_cost(shape, work.dtype, sizes.grid, True, checkpointed=checkpointed)
            block = vision_block_cost(shape, work.dtype, sizes.grid, False, True)
            block_kept = block.output if checkpointed else block.retained
            per_block = block_kept * videos
            for _ in range(shape.vision_depth):
                ledger.moment(vision_activations=vision_saved + block.forward_peak * videos)
                vision_saved += per_block
            # the stem and the merger (under checkpointing, also the rotary tables every block keeps)
            rest = max(0, tower.retained - block_kept)
            if shape.deepstack_levels:  # each DeepStack merger keeps its own activations (not its output,
                # which the traced tower concatenates into a larger one)
                deep = vision_tower_cost(shape, work.dtype, sizes.grid, True, True, checkpointed)
                merger = deep.retained - tower.retained - (deep.output - tower.output)
                rest += shape.deepstack_levels * max(0, merger)
            vision_saved += rest * videos
            live["vision activations"] += vision_saved
        live["lm activations"] += self.forward_inputs()
        tokens = sizes.loss_rows * sizes.loss_length
        kept_by_layer = []
        for index, kind in enumerate(shape.text_layers):
            # LoRA's frozen embedding gives the first layer an input without grad, unless checkpointing (which
            # makes the embeddings require grad)
            first_without = index == 0 and work.training == "lora" and not work.gradient_checkpointing
            layer = self.text_layer(kind, sizes.loss_rows, sizes.loss_length, True, True, not first_without)
            ledger.moment(lm_activations=layer.forward_peak)
            kept = layer.output if work.gradient_checkpointing else layer.retained
            live["lm activations"] += kept
            kept_by_layer.append((layer, kept))
        live["lm activations"] += tokens * shape.hidden * 8  # the final norm's saved tensors
        saved, transient = head_forward(shape, work, tokens, sizes.scored, self.device)
        ledger.moment(logits=saved + transient)
        # the forward's inputs are dropped when it returns, but for what backward keeps of them: the attention
        # mask, the video placeholders' (tokens x hidden) boolean mask, ids and positions
        live["lm activations"] += self.kept_inputs() - self.forward_inputs()
        live["logits and log-probs"] += saved
        ledger.moment(logits=head_backward(shape, work, tokens, sizes.scored, self.device))
        live["logits and log-probs"] -= saved
        # the first parameter gradients have arrived: ZeRO-1/2's gradient hook allocates the reduce bucket, which
        # the end of the backward releases
        live["deepspeed buffers"] += self.deepspeed.backward
        # the head's gradient: tied to the input embedding, it waits in autograd's input buffer for the
        # embedding's (the engine sums the two); untied, it is the weight's gradient now
        head_grad = shape.vocab * shape.hidden * b if head_trains(work) else 0
        if shape.tied:
            live["logits and log-probs"] += head_grad
        elif not grads_before:
            live["gradients"] += head_grad
        live["lm activations"] -= tokens * shape.hidden * 8
        flowing = tokens * shape.hidden * (4 + b)  # the gradient arriving from the head, and its cast
        for layer, kept in reversed(kept_by_layer):
            if (
                work.gradient_checkpointing
            ):  # the layer's forward runs again, then its backward on what it saved
                ledger.moment(lm_activations=flowing + layer.forward_peak)
            ledger.moment(lm_activations=flowing + layer.retained - kept + layer.backward_peak)
            live["lm activations"] -= kept
            if not grads_before:
                live["gradients"] += layer.param_grads
        live["lm activations"] = 0
        if self.tower_trains:
            block = vision_block_cost(shape, work.dtype, sizes.grid, False, True)
            for _ in range(shape.vision_depth):
                recompute = block.forward_peak * videos if work.gradient_checkpointing else 0
                ledger.moment(vision_activations=recompute + block.backward_peak * videos)
                live["vision activations"] -= per_block
                if not grads_before:
                    live["gradients"] += block.param_grads
            live["vision activations"] -= vision_saved - per_block * shape.vision_depth
            if not grads_before:  # the stem's and the mergers'
                live["gradients"] += max(0, shape.vision_params * b - block.param_grads * shape.vision_depth)
            if self.device != "cpu":
                live["vision activations"] -= videos * sizes.patches * shape.patch_values * PIXEL_BYTES
        # the input embedding's backward comes last (its forward ran before the tower's): its dense gradient,
        # and if tied, the sum of it and the head's, both alive with the head's until the sum is assigned
        if head_grad:
            embedding = shape.vocab * shape.hidden * b
            ledger.moment(lm_activations=embedding * (2 if shape.tied else 1) + tokens * shape.hidden * b)
            live["logits and log-probs"] -= head_grad if shape.tied else 0
        phase = ledger.take_phase()
        live["gradients"] = self.states["gradients"]
        live["deepspeed buffers"] -= self.deepspeed.backward
        return phase

    def optimizer(self) -> PhaseMemory:
        self.ledger.moment(deepspeed_buffers=self.deepspeed.step)
        return self.ledger.take_phase()
