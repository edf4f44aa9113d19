"""Per-block parameter bytes that gradient and parameter synchronisation move.

Kept in one place so the trace's DP and ZeRO collectives split exactly the
totals :mod:`stageopt.workload.stats` reports: summing these over a stage's
blocks gives ``stage_params`` (the output layer of a tied embedding is not a
second copy when it sits on the embedding's stage, i.e. pp == 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from stageopt.parallel.ranks import expert_dp_group
from stageopt.workload import Workload


@dataclass(frozen=True, slots=True)
class BlockParams:
    """Parameters one rank holds for one block (counts, not bytes)."""

    dense: int
    expert: int
    tp_partial: int  # parameters whose gradient is a partial sum over TP (sequence-parallel norms)

    def of_group(self, group: str) -> int:
        """Parameters reduced on ``group`` (``edp_cp``, or ``tp_edp_cp`` with etp=1, expert; the dense
        group, ``dp_cp`` or with hybrid sharding ``shard_cp``, dense)."""
        return self.expert if group in EXPERT_GROUPS else self.dense


EXPERT_GROUPS = ("edp_cp", "tp_edp_cp")


def block_params(work: Workload, kind: str) -> BlockParams:
    dense = work.value(kind, "local_dense")
    if work.plan.pp == 1:
        dense -= work.value(kind, "local_dense_uncounted")
    tp_partial = work.value(kind, "local_dense_tp_partial")
    if expert_dp_group(work.plan) == "edp_cp":  # with etp=1 the expert group spans tp: no separate tp sum
        tp_partial += work.value(kind, "local_expert_tp_partial")
    return BlockParams(dense=round(dense), expert=round(work.value(kind, "local_expert")),
                       tp_partial=round(tp_partial))


def ceil_div(a: float, b: int) -> int:
    """Per-rank share of a buffer split ``b`` ways, padded up as Megatron pads its DP buffers (whole bytes:
    ``a`` may be fractional, as NVFP4's 4.5 bits a parameter)."""
    return int(-(-a // b))
