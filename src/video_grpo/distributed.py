"""How a run that ``accelerate launch`` (torchrun) started ends: every rank together, then the process group gone.

Why: a rank that leaves Python with its process group still up tears the group down in interpreter finalisation,
while its peers may still be working (rank 0 saving the processor, say). On a two-"node" run we saw such a rank
abort at exit ("terminate called without an active exception", SIGABRT) after training and saving
succeeded; its launcher then reported a failure and the other node's launcher waited 300 s at the exit barrier.
Every entry point (``grpo``, ``sft``, ``evaluate``, ``curate``) ends with :func:`end_run` on every rank.
"""

from __future__ import annotations


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
