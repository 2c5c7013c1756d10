"""DeepSpeed's own device buffers per rank, besides the model states, as DeepSpeed 0.19.8 allocates them.

The shipped accelerate configs (``configs/accelerate/*.yaml``) pass no DeepSpeed JSON: accelerate 1.16's
``DeepSpeedPlugin`` builds a ``zero_optimization`` block with the stage and the offload devices only, so neither
accelerate's nor transformers' filling of ``"auto"`` values (``reduce_bucket_size = hidden_size**2``...) applies (the
keys are absent, not ``"auto"``), and DeepSpeed's defaults do (``runtime/zero/config.py``): ``reduce_bucket_size``
5e8 elements, ``contiguous_gradients`` true, ``overlap_comm`` true for stage 3 only, ``sub_group_size`` 1e9. The
gradients are communicated in the engine's model dtype (``communication_data_type``): bf16 when accelerate's
``mixed_precision`` is bf16, whatever the recipe's ``dtype`` (the bf16 engine casts the weights), else the weights'.

- **ZeRO-1 and 2, the reduce bucket** (``stage_1_and_2.py``): ``setup_buckets``, called by the first parameter's
  gradient hook of each backward, allocates ``torch.empty(reduce_bucket_size)`` in the gradient dtype whatever the
  model's size (a second one with ``overlap_comm``, off by default here); ``independent_gradient_partition_epilogue``
  releases it when the backward ends. So it is alive from the first parameter gradient to the end of the backward.
- **ZeRO-3, the reduce bucket** (``stage3.py``): the optimizer allocates one ``torch.empty(reduce_bucket_size)``
  per communication dtype when it is built (``contiguous_gradients``) and keeps it for the run: alive all step.
- **The optimizer step.** ZeRO-1/2's ``step`` casts the rank's gradient partition to a float32 copy (``.grad`` of
  the float32 master partition) and keeps it through Adam; ZeRO-3's ``_prepare_fp32_grad_for_sub_group`` flattens
  a sub-group's gradients (a new tensor in the gradient dtype) and casts that to float32, both alive for the cast.
  With the optimizer offloaded this happens in host memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from video_grpo.plan.sizes import DTYPE_BYTES
from video_grpo.plan.workload import Workload

REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeedZeroConfig.reduce_bucket_size's default
SUB_GROUP_ELEMENTS = 1_000_000_000  # DeepSpeedZeroConfig.sub_group_size's default (ZeRO-3's step)
OVERLAP_COMM = {1: False, 2: False, 3: True}  # DeepSpeedZeroConfig.overlap_comm's default by stage


@dataclass(frozen=True)
class DeepSpeedBuffers:
    backward: int = 0  # alive from the first parameter gradient to the end of each backward (ZeRO-1/2)
    persistent: int = 0  # allocated when the engine is built, alive all run (ZeRO-3)
    step: int = 0  # the optimizer step's transient peak


def deepspeed_buffers(work: Workload, trainable: int) -> DeepSpeedBuffers:
    """The buffers of the module's docstring for ``work``, which trains ``trainable`` parameters; none without
    DeepSpeed (stage 0)."""
    if work.zero_stage == 0:
        return DeepSpeedBuffers()
    b = DTYPE_BYTES["bfloat16" if work.mixed_precision else work.dtype]
    bucket = REDUCE_BUCKET_ELEMENTS * b
    partition = trainable // max(1, work.num_processes)
    if work.zero_stage == 3:
        step = 0 if work.offload_optimizer else min(partition, SUB_GROUP_ELEMENTS) * (b + 4)
        return DeepSpeedBuffers(persistent=bucket, step=step)
    copies = 2 if OVERLAP_COMM[work.zero_stage] else 1
    return DeepSpeedBuffers(backward=copies * bucket, step=0 if work.offload_optimizer else partition * 4)
