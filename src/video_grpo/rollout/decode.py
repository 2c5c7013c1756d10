"""Decoding from one static cache with a compiled step (``decode_compile``): rollouts at the speed of the memory bus.

An eager decode step of a 3B model dispatches about 1,460 ATen ops, each a kernel launch on a GPU; at 8-16 rows
the launches, not the bytes read, set the step time. :class:`CompiledDecoder` keeps what a compiled step needs to
run at a fixed shape:

1. **One static cache**, sized once: ``rows`` (every row of one generation call) x ``max_cache_len`` (the longest
   prompt the recipe's video budget allows + ``max_completion_length``). The attention mask spans the whole cache,
   so the prompt's width never changes the graph. A greedy call with fewer rows is padded with copies of its last
   row, whose answers are dropped; a sampled one decodes on the cache's first rows (views: padding rows would draw
   from the random generator and change every later token).
2. **Filled in place** after :func:`video_grpo.rollout.prefill.generate`'s one prefill per prompt: each row's keys and
   values (and Qwen3.5's Gated DeltaNet convolution and recurrent states) are copied from the prefill's
   ``DynamicCache`` into the static tensors (``copy_``), layer by layer, each prefill layer freed once copied; a
   kept cache's data pointers stay fixed from call to call.
3. **Decoded by a compiled forward**: transformers' own ``generate`` loop (its sampling, logits processors and
   stopping) with ``disable_compile=False`` (TRL sets it True) and a ``CompileConfig`` whose backend counts
   graphs compiled and steps run through them (:class:`DecodeStats`), so a silent fall back to eager is visible.
   Positions (``rope_deltas``) and the 4-D mask are computed outside the graph by ``generate``: the step sees
   ``input_ids (rows, 1)``, position ids, ``mm_token_type_ids``, the mask and the cache, in one graph. Within one
   call, only the first step checks every dynamo guard (:meth:`CompiledDecoder._step`).

Graphs: one per call shape: model mode (training generation runs the model in train mode, evaluation in eval mode)
x row count of a sampled call (training samples one count: TRL yields whole generation batches only) x cache length
(one more each time the cache grows); so a run with evaluation compiles 2-3. Anything beyond the first is counted in
``decode/recompiles``. A cache that must grow (a prompt longer than the recipe's worst case) or a call with more
rows than planned is reallocated: one recompile, with a warning each time. A recompile that no new call shape
explains (a guard on something that should not change, such as a module's hooks; a new shape explains what the
first step of its first call compiles, not a compile at a later step of that call) is logged with the guard that
failed; after :data:`MAX_UNEXPECTED_RECOMPILES` of them, or before torch's recompile limit, the step refuses to
compile and the decoder falls back (:func:`_counting_backend`).

CUDA graphs (``decode_cuda_graphs``, off by default) replay the whole step as one launch; they bake in the
addresses of the weights and the cache. The cache keeps its addresses by construction (``keep_cache``, on
whenever CUDA graphs are: the cache then stays allocated for the run, which the planner counts). Under ZeRO-3 with
``ds3_gather_for_generation`` the weights are gathered into new buffers for each generation call (they moved
between calls on the CPU twin), so there the step is compiled without CUDA graphs (see :func:`decode_settings`).
Inductor may still skip CUDA graphs it was asked for; each call counts the skips (``decode/cuda_graph_skips``) and
warns. Without CUDA graphs the cache is allocated per call and freed after it: the memory a plan shows for eager
decoding, within a few percent.

A compiled path never ends an ``auto`` run: any failure but an allocation failure, at any step, makes that call
decode again eagerly and turns compiling off with one warning naming the cause (``decode/fallbacks``);
``decode_compile: true`` stops with a clear error instead (:func:`video_grpo.rollout.prefill.generate`). An allocation
failure reaches the caller as ``torch.OutOfMemoryError`` itself, even one raised inside inductor's compile (which
torch wraps in ``BackendCompilerFailed``), so that a caller can retry smaller (:func:`propagated`).

Exactness: the step computes what the eager step computes (``tests/test_decode_compile.py``: the same greedy and
same-seed sampled tokens in every family, fp32). In bf16 on a GPU a fused kernel may round differently, which can
change which token is sampled, never the training math: the loss recomputes every log-prob from the tokens.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from video_grpo.rollout.static_cache import fill_layer, init_layer, layer_initialized, row_view

if TYPE_CHECKING:  # imported where used: the planner reads the settings below without importing torch
    import torch

logger = logging.getLogger(__name__)

DECODE_COMPILE_CHOICES = ("auto", "true", "false")
BACKENDS = ("inductor", "aot_eager", "eager")
CACHE_LEN_MULTIPLE = 64  # a static cache's length is rounded up to this, so nearby widths share one graph


def cache_length(positions: int) -> int:
    """A static cache's length for ``positions`` positions: rounded up to :data:`CACHE_LEN_MULTIPLE` (the
    planner's recipe-sized cache and one sized at a call alike)."""
    return -(-positions // CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE


def parse_decode_compile(value: Any, name: str = "decode_compile") -> str:
    """``auto``, ``true`` or ``false`` from a YAML bool or a command-line string; anything else is an error."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip().lower()
    text = {"1": "true", "yes": "true", "on": "true", "0": "false", "no": "false", "off": "false"}.get(
        text, text
    )
    if text not in DECODE_COMPILE_CHOICES:
        raise ValueError(
            f"{name}: {value!r} is not one of auto, true, false (auto: on for CUDA, off elsewhere; true: also on "
            "CPU, for tests; false: eager decoding)."
        )
    return text


def device_type(device: torch.device | str) -> str:
    """``torch.device(device).type``; a name ("cuda", "cuda:1", "cpu") is read without importing torch."""
    if isinstance(device, str):
        return device.split(":", 1)[0]
    return device.type


def decode_compile_on(value: str, device: torch.device | str) -> bool:
    """Whether ``decode_compile`` (parsed) compiles on ``device``: ``auto`` means on CUDA only."""
    if value == "auto":
        return device_type(device) == "cuda"
    return value == "true"


@dataclass(frozen=True)
class DecodeSettings:
    """How the step is compiled. ``cuda_graphs``: replay the step as one CUDA graph (inductor on CUDA only);
    ``keep_cache``: the static cache stays allocated between calls (needed with CUDA graphs; default: as
    ``cuda_graphs``); ``fullgraph``: the step must be one graph (decided before compiling by :func:`step_fullgraph`);
    ``skip_guards``: see :meth:`CompiledDecoder._step` (off under ZeRO-3)."""

    backend: str = "inductor"
    cuda_graphs: bool = False
    keep_cache: bool | None = None
    fullgraph: bool = True
    skip_guards: bool = (
        True  # after a call's first step, check only the guards that tell graphs apart (_step)
    )

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"decode_compile_backend: {self.backend!r} is not one of {', '.join(BACKENDS)}.")
        if self.cuda_graphs and self.backend != "inductor":
            raise ValueError("decode_compile_backend: CUDA graphs need the inductor backend.")

    @property
    def persistent(self) -> bool:
        return self.cuda_graphs if self.keep_cache is None else self.keep_cache


def step_fullgraph(
    zero_stage: int = 0,
    attn_implementation: str | None = None,
    device: torch.device | str = "cpu",
    kernel_layers: tuple[str, ...] = (),
) -> tuple[bool, str]:
    """Whether the step can be compiled as one graph, and why not, decided before anything is compiled (a step
    compiled with ``fullgraph=True`` that meets a graph break fails at its first call):

    - ZeRO-3: DeepSpeed leaves a pre-forward hook on the model during generation that dynamo will not trace; it
      runs eagerly before the graph.
    - FlashAttention (``flash_attention_2`` / ``_3``, what the GPU recipes recommend): its kernel is an opaque call,
      and transformers itself sets ``fullgraph=False`` for it (``_valid_auto_compile_criteria``, 5.24).
    - ``kernel_layers`` (the family's :attr:`~video_grpo.inputs.families.ModelFamily.kernel_layers`, e.g. Qwen3.5's
      Gated DeltaNet) on CUDA, where transformers runs them through hub kernels that may not trace."""
    if zero_stage == 3:
        return False, "ZeRO-3's pre-forward hook runs between graphs"
    if attn_implementation and _is_flash_attention(attn_implementation):
        return False, f"{attn_implementation} is a graph break"
    if kernel_layers and device_type(device) == "cuda":
        return False, f"{', '.join(kernel_layers)} layers may run hub kernels on CUDA"
    return True, "one graph"


def _is_flash_attention(attn_implementation: str) -> bool:
    """transformers' own test (``flash_attention_2``, ``_3``, hub kernels such as ``kernels-community/flash-attn3``,
    ``paged|flash_attention_2``): the implementations for which its ``generate`` compiles without fullgraph."""
    from transformers.utils.generic import is_flash_attention_requested

    return is_flash_attention_requested(requested_attention_implementation=attn_implementation)


def step_shape(config) -> dict[str, Any]:
    """What :func:`step_fullgraph` reads from a model's config: its attention implementation, and the layer types
    its family may run through hub kernels (``families.ModelFamily.kernel_layers``) that the model has."""
    from video_grpo.inputs.families import detect_family
    from video_grpo.inputs.prefix import stateful_layers

    layers = set(stateful_layers(config))
    return {
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "kernel_layers": tuple(kind for kind in detect_family(config).kernel_layers if kind in layers),
    }


def decode_settings(
    backend: str,
    device: torch.device | str,
    zero_stage: int = 0,
    gather_for_generation: bool = True,
    cuda_graphs: bool = False,
    attn_implementation: str | None = None,
    kernel_layers: tuple[str, ...] = (),
) -> tuple[DecodeSettings | None, str]:
    """The settings for a run (None: the step cannot be compiled here), and why, in one line for the log. The one
    place that decides how ZeRO-3 decodes; the trainer and the planner (``plan.workload.decode_path``) ask it.

    - ZeRO-3 without ``ds3_gather_for_generation``: not compiled. Each layer's weights are fetched inside the
      forward, so no rank holds the whole policy while decoding.
    - CUDA graphs (``decode_cuda_graphs``, asked for) need every address the step reads to stay fixed. The cache's
      do, because it then stays allocated for the run (:class:`CompiledDecoder`), which costs its bytes at every
      phase of the step: rows x the longest prompt and answer x KV bytes per token, 20 GB per GPU for the
      TimeLens-8B preset; so they are not the default. The weights' addresses stay fixed too, except under ZeRO-3,
      where ``ds3_gather_for_generation`` gathers them into buffers allocated anew for each generation call
      (measured on the CPU twin, ``tests/test_zero3_bf16.py``: the weights moved between calls): there the step is
      compiled without CUDA graphs, which keeps the kernel fusion and drops the one-launch replay.
    - ``fullgraph``: :func:`step_fullgraph`."""
    if zero_stage == 3 and not gather_for_generation:
        return None, (
            "ZeRO-3 without ds3_gather_for_generation fetches each layer's weights inside the forward, so no rank "
            "holds the whole policy while decoding"
        )
    on_cuda = device_type(device) == "cuda"
    fullgraph, graph_why = step_fullgraph(zero_stage, attn_implementation, device, kernel_layers)
    shape = "one graph" if fullgraph else f"graph breaks allowed ({graph_why})"
    # under ZeRO-3 a later step of a call needed a recompile on the CPU twin: every step checks every guard there
    skip = zero_stage != 3
    plain = DecodeSettings(backend, False, fullgraph=fullgraph, skip_guards=skip)
    if not cuda_graphs:
        return plain, f"compiled ({backend}, {shape}), without CUDA graphs (decode_cuda_graphs: false)"
    if not on_cuda or backend != "inductor":
        why = "not on CUDA" if not on_cuda else f"they need the inductor backend, not {backend}"
        return plain, f"compiled ({backend}, {shape}) without the CUDA graphs asked for: {why}"
    if zero_stage == 3:
        return plain, (
            f"compiled (inductor, {shape}) without the CUDA graphs asked for: ZeRO-3 gathers the weights into new "
            "buffers for each generation call"
        )
    settings = DecodeSettings(backend, True, fullgraph=fullgraph, skip_guards=skip)
    return settings, f"compiled (inductor, {shape}) with CUDA graphs"


# torch's recompile_limit (8 in torch 2.14) counts the graphs of one code object, the model's __call__ here; the
# decoder stops compiling before it, and after this many recompiles for a call shape it had already compiled
MAX_UNEXPECTED_RECOMPILES = 2


@dataclass
class DecodeStats:
    """What the compiled path did: graphs compiled (the first, then every recompile), decode steps run through
    a compiled graph (counted after each returns), generate calls, calls that fell back to eager after a failure,
    recompiles that no new call shape explains (each one's failed guard in ``last_guard_failure``), cache
    growths beyond the recipe's size, and CUDA graphs inductor skipped.

    The bound on graphs: one per call shape, ``graph_keys``: model mode (training generation runs the model in
    train mode, evaluation in eval mode) x row count of a sampled call (training samples one count) x cache length
    (one more per growth). A run with evaluation needs 2-3."""

    graphs: int = 0
    compiled_steps: int = 0
    calls: int = 0
    fallbacks: int = 0
    unexpected_recompiles: int = 0
    cache_growths: int = 0
    cuda_graph_skips: int = 0
    last_guard_failure: str = ""
    graph_keys: set = field(default_factory=set)  # (rows, cache length, train mode) of each call
    new_key: bool = False  # the call being decoded has a shape no earlier call had
    stepped: bool = False  # a step of the call being decoded has returned: its new shape is compiled by then
    guard_mark: dict = field(default_factory=dict, repr=False)  # guard failures recorded before this compile

    @property
    def recompiles(self) -> int:
        """Compiles of the step beyond the first: another call shape (see the class doc), or an unexpected
        recompile. (Where graph breaks are allowed, one compile makes several graphs: ``graphs`` counts those.)"""
        return max(0, len(self.graph_keys) - 1) + self.unexpected_recompiles if self.graphs else 0


class CompiledDecodeFailed(RuntimeError):
    """The compiled path failed in a way that is not out of memory: a backend or kernel compile error, a CUDA graph
    capture error, a recompile storm. ``auto`` decodes the call again eagerly; ``true`` stops the run."""


class GraphBoundExceeded(RuntimeError):
    """The step would compile more graphs than its call shapes explain, or reach torch's recompile limit."""


def error_chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it was raised from (``raise ... from``, or dynamo's ``inner_exception``), outermost
    first. An error merely being handled when another was raised (``__context__``) is not followed."""
    chain: list[BaseException] = []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        error = error.__cause__ or getattr(error, "inner_exception", None)
    return chain


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is an allocation failure (CUDA's ``OutOfMemoryError``, or
    the CPU allocator's): never taken for a compile failure."""
    import torch

    return any(
        isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)
        for exc in error_chain(error)
    )


def must_propagate(error: BaseException) -> bool:
    """Errors no eager retry can help, raised as they are: out of memory, a device error that leaves the device
    unusable (``torch.AcceleratorError``: an illegal memory access, a device-side assert), a failed collective."""
    return propagated(error) is not None


def propagated(error: BaseException) -> BaseException | None:
    """The error :func:`must_propagate` raises for ``error``: the allocation failure, device error or failed
    collective itself, not the wrapper torch raised it in (an error raised inside a backend's compile reaches the
    step's caller as dynamo's ``BackendCompilerFailed``, or inductor's ``InductorError``, and a caller that retries
    smaller catches ``torch.OutOfMemoryError``); None if ``error`` must not propagate."""
    import torch

    fatal = (torch.AcceleratorError, torch.distributed.DistError)
    chain = error_chain(error)
    for found in (
        lambda exc: isinstance(exc, torch.OutOfMemoryError),
        lambda exc: "can't allocate memory" in str(exc),  # the CPU allocator's RuntimeError
        lambda exc: isinstance(exc, fatal),
    ):
        # the innermost: the one raised where it happened (a wrapper's message quotes it too)
        match = [exc for exc in chain if found(exc)]
        if match:
            return match[-1]
    return None


def guard_failure_counts() -> dict:
    """How many guard failures dynamo has recorded so far, per function (a mark for :func:`guard_failure_since`)."""
    from torch._dynamo.utils import guard_failures

    return {code: len(failures) for code, failures in guard_failures.items()}


def guard_failure_since(mark: dict) -> str:
    """The guard that failed for the latest recompile after ``mark``: dynamo records, per recompile, one reason for
    each cached graph of the function, the most recently used first, and reports the first; so does this (from the
    function whose record grew last), even with dynamo's logs off."""
    from torch._dynamo.utils import guard_failures

    grown = [
        failures[mark.get(code, 0)]
        for code, failures in guard_failures.items()
        if len(failures) > mark.get(code, 0)
    ]
    return grown[-1].splitlines()[0] if grown else ""


def _cuda_graph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def _compile_graph(settings: DecodeSettings, graph, example_inputs):
    """The backend's compiled callable for one traced graph."""
    import torch

    if settings.backend == "inductor":
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(graph, example_inputs, config_patches={"triton.cudagraphs": settings.cuda_graphs})
    return torch._dynamo.lookup_backend(settings.backend)(graph, example_inputs)


def _counting_backend(settings: DecodeSettings, stats: DecodeStats):
    """A ``torch.compile`` backend (a plain function, so transformers' deep-copied ``CompileConfig`` compares equal
    and its compiled call is reused) that counts graphs and the steps run through them (after each returns), and
    keeps the graph count within its bound (see :class:`DecodeStats`): a graph for a call shape compiled before
    (in an earlier call, or in an earlier step of the same call) is an unexpected recompile, logged with the guard
    that failed; past :data:`MAX_UNEXPECTED_RECOMPILES`, or at torch's recompile limit, it refuses to compile, and
    the decoder falls back (``auto``) or stops (``true``)."""

    def backend(graph, example_inputs, **_):
        import torch

        limit = torch._dynamo.config.recompile_limit
        # a new call shape explains what its call's first step compiles (one graph, or one per graph break's
        # function: where a break falls inside a layer, dynamo compiles that function again for a later layer
        # within the step, so counting compiles per function would take those for guard failures); nothing
        # changes between two steps of a call, so a compile at a later step is a guard that failed
        if not stats.new_key or stats.stepped:
            stats.unexpected_recompiles += 1
            stats.last_guard_failure = guard_failure_since(stats.guard_mark)
            logger.warning(
                "decode_compile: the step recompiled for a call shape it had compiled before (guard that failed: "
                f"{stats.last_guard_failure or 'unknown'}); {stats.unexpected_recompiles} such recompile(s)"
            )
        entries = len(stats.graph_keys) + stats.unexpected_recompiles
        if stats.unexpected_recompiles > MAX_UNEXPECTED_RECOMPILES or entries >= limit:
            raise GraphBoundExceeded(
                f"{stats.graphs} graphs compiled for {len(stats.graph_keys)} call shape(s), "
                f"{stats.unexpected_recompiles} unexpected recompile(s), torch's recompile_limit {limit}; guard that "
                f"failed last: {stats.last_guard_failure or 'unknown'}"
            )
        stats.graphs += 1
        stats.guard_mark = guard_failure_counts()
        compiled = _compile_graph(settings, graph, example_inputs)

        def run(*args, **kwargs):
            output = compiled(*args, **kwargs)
            stats.compiled_steps += 1
            return output

        if hasattr(compiled, "_boxed_call"):  # how the caller hands over the inputs, as the backend said
            run._boxed_call = compiled._boxed_call
        return run

    return backend


class CompiledDecoder:
    """One static cache and one compiled decode step for a model's generation calls (see the module doc).

    ``rows``: rows of the largest generation call (None: the first call's); ``max_cache_len``: the longest
    prompt plus the most new tokens (None: from the first call, rounded up to :data:`CACHE_LEN_MULTIPLE`).
    ``strict`` (``decode_compile: true``): a failure of the compiled path stops the run with a clear error instead
    of falling back to eager decoding (``auto``)."""

    def __init__(
        self,
        rows: int | None = None,
        max_cache_len: int | None = None,
        settings: DecodeSettings | None = None,
        strict: bool = False,
    ) -> None:
        from transformers import CompileConfig

        self.rows = rows
        self.max_cache_len = max_cache_len
        self.settings = settings or DecodeSettings()
        self.stats = DecodeStats()
        self.strict = strict
        self.cache = None  # the static cache of ``rows`` rows
        self._views: dict[int, Any] = {}  # fewer rows: caches whose tensors are the first rows of ``cache``
        self.enabled = True
        self.last_call_compiled = False
        self._compiled = None  # (model, its torch.compile'd __call__)
        self._guards_checked = False
        self.skip_guards = self.settings.skip_guards  # see _step
        self.compile_config = CompileConfig(
            fullgraph=self.settings.fullgraph,
            dynamic=False,
            backend=_counting_backend(self.settings, self.stats),
            mode=None,
        )
        self.compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told

    # -- the cache ------------------------------------------------------------------------------------------

    def _allocate(self, model, prefill_cache) -> None:
        """A fresh static cache (rows, heads, max_cache_len, head_dim); its layers get their tensors in
        :meth:`fill`, one at a time, as the prefill's layers are freed (the two never coexist whole)."""
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=self.max_cache_len)
        if len(cache.layers) != len(prefill_cache.layers):
            raise NotImplementedError(
                f"decode_compile: the static cache has {len(cache.layers)} layers, the prefill's "
                f"{len(prefill_cache.layers)}"
            )
        self.cache, self._views = cache, {self.rows: cache}

    def cache_for(self, rows: int):
        """The static cache of ``rows`` rows: the whole cache, or one whose tensors are its first ``rows`` rows
        (views: the same addresses, so a sampled partial batch needs no copy and no padding)."""
        if rows not in self._views:
            self._views[rows] = row_view(self.cache, rows)
        return self._views[rows]

    def data_pointers(self) -> list[int]:
        """The data pointer of every tensor of the static cache (CUDA graphs need them fixed)."""
        pointers = []
        for layer in self.cache.layers if self.cache is not None else []:
            for name in ("keys", "values", "cumulative_length"):
                if getattr(layer, name, None) is not None:
                    pointers.append(getattr(layer, name).data_ptr())
            for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
                pointers += [state.data_ptr() for state in states.values() if state is not None]
        return pointers

    def release(self) -> None:
        """Drop the cache (it is allocated again on the next call)."""
        self.cache, self._views = None, {}

    def fill(self, model, prefill_cache, index: torch.Tensor, width: int, new_tokens: int):
        """Copy row ``index[r]`` of ``prefill_cache`` (the prompts of ``width`` tokens but their last) into row ``r``
        of the static cache, in place, making room for ``new_tokens``; returns the cache of ``len(index)`` rows.
        The prefill's tensors are freed layer by layer as they are copied."""
        rows, need = len(index), width + new_tokens
        sized = self.rows is not None and self.max_cache_len is not None
        if sized and (rows > self.rows or need > self.max_cache_len):
            self.stats.cache_growths += 1
            logger.warning(
                f"decode_compile: a call needs {rows} rows x {need} positions, beyond the static cache's "
                f"{self.rows} x {self.max_cache_len} (sized from the recipe's longest prompt); it grows, and the step "
                "compiles one more graph. Raise the recipe's decode cache estimate if this repeats."
            )
            self.release()
        if rows > (self.rows or 0) or need > (self.max_cache_len or 0):
            self.rows = max(self.rows or 0, rows)
            self.max_cache_len = max(self.max_cache_len or 0, cache_length(need))
        if self.cache is None:
            self._allocate(model, prefill_cache)
            if rows < self.rows:  # the views need every layer's tensors first
                for static, dynamic in zip(self.cache.layers, prefill_cache.layers, strict=True):
                    init_layer(static, dynamic, self.rows)
        cache = self.cache_for(rows)
        for static, whole, dynamic in zip(cache.layers, self.cache.layers, prefill_cache.layers, strict=True):
            if not layer_initialized(whole):
                init_layer(whole, dynamic, self.rows)
            fill_layer(static, dynamic, index, width - 1)
        return cache

    @contextlib.contextmanager
    def _serving_step(self, model):
        """Within the block, transformers' ``generate`` on ``model`` decodes with :meth:`_step` (it takes the
        compiled call it cached for an equal ``CompileConfig``; the previous one is put back after)."""
        import torch

        if self._compiled is None or self._compiled[0] is not model:
            self._compiled = (model, torch.compile(model.__call__, **self.compile_config.to_dict()))
        saved = {
            name: vars(model)[name]
            for name in ("_compiled_call", "_last_compile_config")
            if name in vars(model)
        }
        model._compiled_call, model._last_compile_config = self._step, self.compile_config
        self._guards_checked = False
        try:
            yield
        finally:
            for name in ("_compiled_call", "_last_compile_config"):
                vars(model).pop(name, None)
            vars(model).update(saved)

    def _step(self, *args, **kwargs):
        """One decode step through the compiled forward (:meth:`_run_step`); its failures are the compiled path's."""
        with self._compiled_path():
            output = self._run_step(*args, **kwargs)
        self.stats.stepped = True
        return output

    def _run_step(self, *args, **kwargs):
        """Dynamo checks its guards (every weight's and input's shape, dtype, the model's mode...) before each
        call: at 36 layers that took a fifth of a compiled CPU step (``video_grpo.bench.decode_step``). Within one
        ``generate`` call nothing they check changes from step to step (the same rows, cache, weights and mode), so
        after the first step of a call has passed them all, the others check only the guards that tell the cached
        graphs apart (``skip_guard_eval_unsafe``).

        Not under ZeRO-3 (``DecodeSettings.skip_guards``: DeepSpeed's pre-forward hook runs between two graphs,
        and on the ZeRO-3 CPU twin a later step of a call did need a recompile there). If dynamo finds a step that
        needs one anyway, it refuses to compile in this stance; the step then runs with every guard, and so do
        all later ones."""
        import torch

        _, compiled = self._compiled
        if not self._guards_checked or not self.skip_guards:
            output = compiled(*args, **kwargs)
            self._guards_checked = True
            return output
        try:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return compiled(*args, **kwargs)
        except RuntimeError as err:
            if "skip_guard_eval_unsafe" not in str(err):
                raise
            self.skip_guards = False
            logger.warning(
                f"decode_compile: a step needed a recompile within a call; every step checks guards now ({err})"
            )
            return compiled(*args, **kwargs)

    def turn_off(self, error: BaseException) -> None:
        """After a failure of the compiled path (``auto``): eager decoding from now on, said once."""
        self.enabled = self.last_call_compiled = False
        self.stats.fallbacks += 1
        self.release()
        self._compiled = (
            None  # the compiled call and, with CUDA graphs, their memory pool are not needed again
        )
        if self.settings.cuda_graphs:
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees

            reset_cudagraph_trees()
        logger.warning(
            f"decode_compile: the compiled decode step failed ({describe_failure(error)}); this call and every "
            "later one decode eagerly (decode/compiled = 0, decode/fallbacks = 1). Set decode_compile: false to "
            "silence this, or true to make it an error."
        )

    def failure_error(self, error: BaseException) -> RuntimeError:
        """The error that stops a ``decode_compile: true`` run."""
        return RuntimeError(
            f"decode_compile: true, and the compiled decode step failed ({describe_failure(error)}). Set "
            "decode_compile: auto to fall back to eager decoding when this happens, or false to decode eagerly."
        )

    # -- decoding -------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _compiled_path(self):
        """Failures inside the block are the compiled path's: raised as :class:`CompiledDecodeFailed`, unless
        :func:`must_propagate`; those are raised unwrapped (:func:`propagated`)."""
        try:
            yield
        except CompiledDecodeFailed:
            raise
        except Exception as err:
            inner = propagated(err)
            if inner is err:
                raise
            if inner is not None:  # unwrapped, so that a caller's ``except torch.OutOfMemoryError`` sees it
                note = f"decode_compile: raised in the compiled decode step; torch wrapped it in {type(err).__name__}"
                if note not in getattr(inner, "__notes__", ()):
                    inner.add_note(note)
                raise inner from None
            raise CompiledDecodeFailed(describe_failure(err, self.stats.guard_mark)) from err

    def generate(
        self,
        model,
        generate_fn,
        prefill_cache,
        index: torch.Tensor,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mm_token_type_ids: torch.Tensor,
        **kwargs: Any,
    ):
        """``generate_fn`` (the model's ``generate``) over the rows, each starting from row ``index[r]`` of
        ``prefill_cache`` (which holds every prompt but its last token), through the compiled step. A failure of
        the compiled path's own parts (filling the static cache, tracing, compiling or running the compiled step)
        is raised as :class:`CompiledDecodeFailed` (the caller decodes the call again eagerly, or stops the run),
        except what :func:`must_propagate` names; any other error (sampling, a collective, the model's first eager
        step) propagates as it is.

        A greedy call with fewer rows than the cache is padded to them (copies of its last row, whose answers are
        dropped), so it reuses the graph. A sampled call is not: the padding rows would draw from the random
        generator too and change every later token, so it decodes on the cache's first rows, and a new row count
        compiles one more graph (training samples a fixed count: TRL yields whole generation batches only)."""
        import torch

        config = kwargs.get("generation_config") or model.generation_config
        new_tokens = kwargs.get("max_new_tokens") or config.max_new_tokens
        if new_tokens is None:
            raise ValueError("decode_compile: generate needs max_new_tokens to size the static cache")
        sampling = kwargs.get("do_sample", config.do_sample)
        real = input_ids.shape[0]
        rows = real if sampling else max(real, self.rows or real)
        if rows > real:
            pick = torch.cat([torch.arange(real), torch.full((rows - real,), real - 1)]).to(input_ids.device)
            input_ids, attention_mask, mm_token_type_ids = (
                input_ids[pick],
                attention_mask[pick],
                mm_token_type_ids[pick],
            )
            index = index[pick]
        backbone = _backbone(model)
        backbone.rope_deltas = backbone.rope_deltas[index]
        with self._compiled_path():
            cache = self.fill(model, prefill_cache, index, input_ids.shape[1], new_tokens)
        del prefill_cache
        key = (rows, self.max_cache_len, model.training)
        self.stats.new_key = key not in self.stats.graph_keys
        self.stats.graph_keys.add(key)
        self.stats.stepped = False
        self.stats.calls += 1
        steps_before, skips_before = self.stats.compiled_steps, _cuda_graph_skips()
        language_model = model.get_base_model() if hasattr(model, "get_base_model") else model
        try:
            with self._serving_step(language_model):
                output = generate_fn(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    mm_token_type_ids=mm_token_type_ids,
                    cache=cache,
                    disable_compile=False,
                    compile_config=self.compile_config,
                    **kwargs,
                )
        finally:
            del cache
            if not self.settings.persistent:
                self.release()
        self.last_call_compiled = self.stats.compiled_steps > steps_before or _steps(output, input_ids) <= 1
        self._confirm_cuda_graphs(_cuda_graph_skips() - skips_before)
        return _take_rows(output, real) if rows > real else output

    def _confirm_cuda_graphs(self, skips: int) -> None:
        """Inductor skips CUDA graphs where it cannot capture the step (an input on the CPU, a mutated input, too
        many re-records) and says so only in a log that is off by default: count it, and warn where they were
        asked for."""
        if not skips:
            return
        self.stats.cuda_graph_skips += skips
        if self.settings.cuda_graphs:
            logger.warning(
                f"decode_compile: inductor skipped the CUDA graphs asked for ({self.stats.cuda_graph_skips} so far; "
                "decode/cuda_graph_skips). The step runs compiled without the one-launch replay; "
                "TORCH_LOGS=perf_hints says why."
            )


def describe_failure(error: BaseException, guard_mark: dict | None = None) -> str:
    """One line naming a failure of the compiled path; for torch's recompile limit, with the guard that failed
    for the recompile after ``guard_mark`` (:func:`guard_failure_counts`)."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    if isinstance(error, CompiledDecodeFailed):  # already described where it was raised
        return str(error)

    def first_line(exc: BaseException) -> str:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__

    chain = error_chain(error)  # a wrapper (BackendCompilerFailed), then its causes
    text = first_line(chain[0]) + ("" if len(chain) == 1 else f" <- {first_line(chain[-1])}")
    if any(isinstance(exc, FailOnRecompileLimitHit) for exc in chain):
        guard = guard_failure_since(guard_mark or {})
        text += f" (guard that failed: {guard})" if guard else ""
    return text[:600]


def add_decode_arguments(parser) -> None:
    """``--decode_compile`` and ``--decode_compile_backend`` for the tools that generate (evaluate run, curate)."""
    parser.add_argument(
        "--decode_compile",
        type=parse_decode_compile,
        default="auto",
        help="decode from one static cache with a compiled step: auto (on CUDA), true, false (the same tokens)",
    )
    parser.add_argument(
        "--decode_compile_backend",
        choices=BACKENDS,
        default="inductor",
        help="torch.compile backend of the decode step (aot_eager/eager: no code generation, for tests)",
    )
    parser.add_argument(
        "--decode_cuda_graphs",
        type=_cuda_graphs_argument,
        default=False,
        help="replay the compiled step as one CUDA graph (true/false; keeps the static cache allocated)",
    )


def parse_cuda_graphs(value: Any) -> bool:
    """``--decode_cuda_graphs``: true or false (a YAML bool too); ``auto`` is refused, since CUDA graphs cost the
    static cache's bytes all step and are asked for, never guessed."""
    text = parse_decode_compile(value, "--decode_cuda_graphs")
    if text == "auto":
        raise ValueError("--decode_cuda_graphs: 'auto' is not a choice; say true or false (default false).")
    return text == "true"


def _cuda_graphs_argument(value: str) -> bool:
    import argparse

    try:
        return parse_cuda_graphs(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).split(": ", 1)[1]) from err


def evaluation_decoder(args, device, rows: int, config=None) -> CompiledDecoder | None:
    """The decoder of ``evaluate run`` / ``curate`` (``args.decode_compile``), or None to decode eagerly: ``rows``
    answers per generate call; its cache length is set by the caller from the recipe (else: the first call's).
    ``config``: the model's, whose attention implementation and layers decide ``fullgraph`` (:func:`step_shape`)."""
    value = parse_decode_compile(getattr(args, "decode_compile", "false"))
    if not decode_compile_on(value, device):
        return None
    settings, why = decode_settings(
        getattr(args, "decode_compile_backend", "inductor"),
        device,
        cuda_graphs=getattr(args, "decode_cuda_graphs", False),
        **(step_shape(config) if config is not None else {}),
    )
    logger.warning(f"decode_compile: {why}; a static cache of {rows} rows")
    return CompiledDecoder(rows, None, settings, strict=value == "true")


def _backbone(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def _steps(output, input_ids: torch.Tensor) -> int:
    import torch

    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    return sequences.shape[1] - input_ids.shape[1]


def _take_rows(output, real: int):
    """The first ``real`` rows of ``generate``'s output (a tensor, or a dict output with per-step tuples)."""
    import torch

    if isinstance(output, torch.Tensor):
        return output[:real]
    for key, value in list(output.items()):
        if isinstance(value, torch.Tensor):
            output[key] = value[:real]
        elif isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
            output[key] = tuple(step[:real] for step in value)
    return output
