"""How a run that ``accelerate launch`` (torchrun) started ends: every rank together, then out of the process
without tearing the interpreter down under live communication threads.

What went wrong (seen in the two-"node" test, 2 failures in 110 runs of c6a808d's code): training and saving
succeeded, then one rank aborted at exit ("terminate called without an active exception", SIGABRT), its launcher
reported a failure and the other node's launcher waited 300 s at the elastic exit barrier. A backtrace taken at
the abort (an ``abort()`` interposed with LD_PRELOAD) showed the cause: a gloo worker thread (``pt_gloo_runloop``)
finished a collective and released its tensor during interpreter finalisation; releasing a tensor that has a
Python object needs the GIL, CPython ends any thread that asks for it while finalising (``pthread_exit``), and
that unwinding through a ``noexcept`` destructor calls ``std::terminate``. The process groups, and so their
worker threads, outlive ``destroy_process_group()`` because DeepSpeed's engine, its ZeRO-3 parameters and
``deepspeed.utils.groups`` still hold them.

So every entry point (``grpo``, ``sft``, ``evaluate``, ``curate``) ends with :func:`end_run` (a barrier, then the
process groups torn down) and leaves through :func:`exit_process`, which runs the ``atexit`` handlers and flushes
the logs while Python is whole, then exits without the interpreter's teardown in which those threads are killed.
"""

from __future__ import annotations

import os


def process_state():
    """The launch's ``accelerate.PartialState``, for entry points with no ``Accelerator`` (evaluate, curate).

    It honours ``use_cpu`` (``ACCELERATE_USE_CPU``), as ``Accelerator`` does: without it, processes started on a
    machine with no GPU each see a world of one and all answer every query, instead of sharding them."""
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    return PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))


def end_run(accelerator=None) -> None:
    """A barrier, then the process group torn down (a no-op in a single process). ``accelerator``: the
    trainer's ``Accelerator``, whose ``end_training`` also closes its trackers."""
    from accelerate import PartialState

    state = PartialState()  # the one the run made
    state.wait_for_everyone()
    if accelerator is not None:
        accelerator.end_training()
    else:
        state.destroy_process_group()


def launched() -> bool:
    """Whether this process is one rank of a multi-process launch (torchrun sets ``WORLD_SIZE``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def exit_process(code: int | None = 0) -> None:
    """Leave the process with ``code``. In a multi-process launch, run the ``atexit`` handlers (trackers, loggers)
    and flush, then ``os._exit``: the interpreter's teardown is where communication threads that outlive the
    process groups abort the process (see the module docstring). A single process exits normally."""
    import sys

    if not launched():
        sys.exit(code)
    import atexit
    import logging

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))
