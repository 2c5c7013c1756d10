"""Peak memory a block of code adds: CUDA's allocator peak, or on the CPU the resident set sampled every 2 ms."""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time

import torch

from video_grpo.bench.fork_server import stop_fork_server


class PeakMemory:
    """Memory a block adds at its peak over what was resident when it started (CUDA: allocated; CPU: RSS)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.added_mb = 0.0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            self.before = self.peak = self._rss()
            self.running = True
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()
        return self

    def _poll(self) -> None:
        while self.running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.added_mb = (torch.cuda.max_memory_allocated() - self.before) / 2**20
        else:
            self.running = False
            self.thread.join()
            self.added_mb = (max(self.peak, self._rss()) - self.before) / 2**20


# What the fresh processes of the benchmarks import (the shared-prompt sides, the LoRA memory sides): imported once,
# in the fork server, instead of once per side (about 9 CPU s each on this machine, 6 sides in `bench perf --quick`).
PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "trl.trainer.utils",
    "peft",
    "video_grpo.trainer",
    "video_grpo.bench.lora_memory",
    "video_grpo.bench.shared_prefix",
    "video_grpo.bench.shared_prefix_depth",
    "video_grpo.bench.shared_prefix_qwen3_5",
)
# "spawn": every side in a new interpreter (``python -c``), as before the fork server; CUDA sides always are
FRESH_PROCESS_ENV = "VIDEO_GRPO_BENCH_FRESH"
# How CPU sides start unless the environment says "spawn": the full `bench perf` sets "spawn" (its rows measured as
# they always were), `--quick` keeps the fork server (see :func:`in_fresh_process` for what differs)
START = {"method": "forkserver"}


@contextlib.contextmanager
def fresh_processes(method: str):
    """CPU sides of :func:`in_fresh_process` start by ``method`` ("forkserver" or "spawn") within the block."""
    previous, START["method"] = START["method"], method
    try:
        yield
    finally:
        START["method"] = previous


def in_fresh_process(module: str, function: str, setting: dict, threads: int | None = None) -> dict:
    """``module.function(setting)`` in a process of its own, its JSON-able result back: each side of a memory
    comparison then starts from the same empty state (no allocator cache, no tensors left by the other side).

    On the CPU the process is forked from a server that has imported :data:`PRELOAD` and done nothing else (the
    ``forkserver`` start method), so every side starts from that one state without paying the imports again; a
    CUDA side, or any side with ``VIDEO_GRPO_BENCH_FRESH=spawn``, starts a new interpreter. ``threads``: the side's
    intra-op thread count (default: what a new interpreter would take, ``OMP_NUM_THREADS`` or the cores).

    What differs from a new interpreter: the forked side's resident set counts only the shared-library pages it
    touches itself, so a whole-process peak (the LoRA row's ``ru_maxrss``) reads about 300 MB lower on this machine
    (1,334 vs 1,627 MB for ``--quick``'s beta > 0 side, ratio 0.999 vs 0.995), on both sides alike; peaks over what was resident before the step
    (the shared-prompt rows) measured the same within noise.

    As with any ``multiprocessing`` start method but fork, a script run as ``python script.py`` that calls this must
    keep its work under ``if __name__ == "__main__":`` (the side imports the script first); the ``python -m
    video_grpo.bench...`` commands do."""
    cuda = str(setting.get("device", "cpu")).startswith("cuda")
    if cuda or "spawn" in (os.environ.get(FRESH_PROCESS_ENV), START["method"]):
        return _in_new_interpreter(module, function, setting, threads)
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # read when the server starts: the first call
    if not _server_stopped_at_exit:
        _server_stopped_at_exit.append(atexit.register(stop_fork_server))
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_forked_side, args=(module, function, setting, threads, sender))
    process.start()
    sender.close()
    try:
        ok, result = receiver.recv()
    except EOFError:  # the process ended without sending one (killed, or it failed before the call)
        ok, result = False, "it ended without a result (its stderr says why)"
    process.join()
    if not ok:
        raise RuntimeError(
            f"{module}.{function}({setting}) failed (exit code {process.exitcode}):\n{result[-3000:]}"
        )
    return result


_server_stopped_at_exit: list = []


def _forked_side(module: str, function: str, setting: dict, threads: int | None, sender) -> None:
    """The forked side: stdout to stderr (the benchmark's stdout is JSON lines only), then the call."""
    import importlib
    import traceback

    os.dup2(2, 1)
    if threads:
        torch.set_num_threads(threads)
    try:
        sender.send((True, getattr(importlib.import_module(module), function)(setting)))
    except BaseException:
        sender.send((False, traceback.format_exc()))
        raise


def _in_new_interpreter(module: str, function: str, setting: dict, threads: int | None) -> dict:
    import json
    import subprocess
    import sys

    code = f"import json; from {module} import {function}; print(json.dumps({function}({setting!r})))"
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if result.returncode:
        raise RuntimeError(f"{module}.{function}({setting}) failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
