"""The in-memory program of one pipeline stage: a plain list of small records.

Every rank of a stage runs the same program; what differs between ranks is
named symbolically here (a collective's ``group`` kind, a message's ``peer``
stage) and resolved per rank only when a trace is written. Keeping the
program free of rank numbers is what lets the Chakra writer serialize it once
per stage and lets a symmetric simulator replay one representative rank.
"""

from __future__ import annotations

from dataclasses import dataclass

COMP = "comp"
COLL = "coll"
SEND = "send"
RECV = "recv"
COPY = "copy"  # a copy between GPU and host memory (activation offloading), on the copy engine

NEXT = "next"  # the stage holding the following virtual chunk
PREV = "prev"  # the stage holding the preceding virtual chunk


@dataclass(frozen=True, slots=True)
class ProgramNode:
    """One kernel, collective or message of a stage program.

    Ids are positions in :attr:`StageProgram.nodes`; every dependency points to a
    smaller id, so the list is in topological order. ``num_ops`` counts FLOPs
    (tensor-core plus vector work), ``tensor_size`` the bytes a kernel reads and
    writes, ``comm_size`` the bytes ASTRA-sim expects (per-rank input for an
    all-gather, the whole buffer otherwise). ``phase`` says where the work comes
    from: fwd, bwd, recompute (block ops), dp (end-of-iteration gradient and
    parameter sync), zero3 (per-layer gathers and gradient scatters), p2p,
    optimizer, offload / reload (a layer's saved tensors to host memory and
    back; ``comm_size`` is their bytes).
    """

    id: int
    name: str
    type: str  # comp | coll | send | recv | copy
    phase: str
    data_deps: tuple[int, ...] = ()
    ctrl_deps: tuple[int, ...] = ()
    num_ops: int = 0
    tensor_size: int = 0
    collective: str = ""  # all_reduce | all_gather | reduce_scatter | all_to_all
    comm_size: int = 0
    group: str = ""  # communicator kind (stageopt.parallel.ranks.GROUP_AXES)
    group_size: int = 0
    peer: str = ""  # next | prev (send / recv)
    tag: int = 0
    kernel: str = ""  # comp: matmul | attention | attention_causal | vector (for kernel time models)
    gemm: tuple[int, ...] = (0, 0, 0, 0, 0)  # comp matmul: per-rank m, n, k, batch, elements its cast reads
    precision: int = 0  # comp: precision class of stageopt.hardware.kernels
    launches: int = 1  # comp: kernels the node stands for
    overlap: tuple[int, ...] = ()  # coll: ids of the GEMM nodes it pipelines with (TP overlap)
    async_overlap: tuple[int, ...] = ()  # coll: id of the GEMM node it runs beside when issued asynchronously
    gemm_group: int = -1  # comp: label of its fused GEMM (graph.fusion.group_label of a node id; -1: none)
    wgrad: bool = False  # comp: a weight-gradient GEMM (never split by userbuffer overlap)


@dataclass(frozen=True)
class StageProgram:
    """Everything one rank of ``stage`` executes in one training iteration."""

    stage: int
    nodes: tuple[ProgramNode, ...]

    def groups_used(self) -> set[str]:
        return {n.group for n in self.nodes if n.type == COLL}
