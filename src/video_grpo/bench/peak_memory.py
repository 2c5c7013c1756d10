"""Peak memory a block of code adds: CUDA's allocator peak, or on the CPU the resident set sampled every 2 ms."""

from __future__ import annotations

import os
import threading
import time

import torch


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


def in_fresh_process(module: str, function: str, setting: dict) -> dict:
    """``module.function(setting)`` in a new Python process, its JSON result back: each side of a memory
    comparison then starts from the same empty state (no allocator cache, no tensors left by the other side)."""
    import json
    import subprocess
    import sys

    code = f"import json; from {module} import {function}; print(json.dumps({function}({setting!r})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{module}.{function}({setting}) failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
