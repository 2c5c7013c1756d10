"""A benchmark side forked from the fork server (video_grpo.bench.peak_memory.in_fresh_process) that fails: its
error reaches the caller, whether the side raised or ended without a result, and the server is stopped and waited
for afterwards (video_grpo.bench.fork_server). The server here preloads only the module that runs a side (and so
torch), not the benchmark's libraries."""

from __future__ import annotations

import os

import pytest

from video_grpo.bench import fork_server, peak_memory


@pytest.fixture(scope="module")
def light_fork_server():
    """A fork server of these tests' own, preloading only what unpickling a side needs (this module's imports):
    any running one is stopped first (the preload is read when a server starts), and this one after."""
    fork_server.stop_fork_server()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(peak_memory, "PRELOAD", ("video_grpo.bench.peak_memory",))
        patch.delenv(peak_memory.FRESH_PROCESS_ENV, raising=False)
        yield
    fork_server.stop_fork_server()


def test_a_side_that_raises_reports_its_traceback(light_fork_server):
    assert peak_memory.in_fresh_process("json", "dumps", {"a": 1}) == '{"a": 1}'  # the forked path works
    with pytest.raises(RuntimeError, match=r"json\.loads\(\{'a': 1\}\) failed \(exit code 1\)") as failed:
        peak_memory.in_fresh_process("json", "loads", {"a": 1})  # TypeError: not a str
    assert "TypeError" in str(failed.value)


def exit_at_once(setting: dict) -> None:
    """A side that dies before it can send a result (as one killed for memory would)."""
    os._exit(setting["code"])


def test_a_side_that_exits_without_a_result_is_an_error(light_fork_server):
    with pytest.raises(RuntimeError, match=r"exit code 3\):\nit ended without a result"):
        peak_memory.in_fresh_process(__name__, "exit_at_once", {"code": 3})


def test_the_server_is_stopped_and_waited_for(light_fork_server):
    peak_memory.in_fresh_process("json", "dumps", {})
    from multiprocessing import forkserver

    pid = forkserver._forkserver._forkserver_pid  # the private names stop_fork_server relies on
    assert pid is not None
    fork_server.stop_fork_server()
    with pytest.raises(ChildProcessError):  # already reaped: its CPU is in this process's RUSAGE_CHILDREN
        os.waitpid(pid, os.WNOHANG)
