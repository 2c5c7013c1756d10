"""Stopping multiprocessing's fork server, for the benchmarks that fork their workers or sides from one.

A fork server left running exits with the benchmark, unreaped, and the CPU time of every process it forked drops out
of the benchmark's accounting (``/usr/bin/time``, a parent's ``RUSAGE_CHILDREN``). Stopped and waited for, it and
its forks are this process's waited-for children, as spawned processes are."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def stop_fork_server() -> None:
    """Stop the fork server, if one runs, and wait for it. ``_stop`` is private: how CPython stops it (its own
    tests use it, since 3.4)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    stop = getattr(server, "_stop", None)
    if stop is not None:
        stop()


@contextlib.contextmanager
def reaped_fork_server() -> Iterator[None]:
    """Within the block, processes may fork from the server; after it, the server is stopped and waited for."""
    try:
        yield
    finally:
        stop_fork_server()
