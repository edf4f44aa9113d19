"""Turn a stage program into Chakra nodes and render each rank by patching.

The template carries placeholders for what differs between ranks of a stage:
``pg_name`` holds the group kind (``"tp"``, ``"dp_cp"``, ...) and the message
endpoints hold ``SELF``/``NEXT``/``PREV`` (negative, so never a real rank).
:func:`rank_patches` maps them to one rank's group ids and peers;
:class:`stageopt.chakra.TraceTemplate` splices them into the bytes it
serialized once.

Compute nodes carry their time in ``duration_micros``, from the same kernel
model the replay and analytical backends use (:func:`compute_micros` over
:func:`stageopt.program.durations.node_durations`); the written ``system.json``
turns ASTRA-sim's roofline off, so ASTRA-sim times each kernel by that field.

Attributes per node type, in this order (ASTRA-sim reads them by name):
COMP ``num_ops`` (FLOPs), ``tensor_size`` (bytes read + written),
``is_cpu_op`` false; COMM_COLL ``comm_type``, ``comm_size`` (bytes),
``pg_name``, ``is_cpu_op``; COMM_SEND / COMM_RECV ``comm_src``, ``comm_dst``,
``comm_tag``, ``comm_size``, ``is_cpu_op``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stageopt.chakra import CommType, NodeType, TraceTemplate, make_node
from stageopt.parallel.plan import Plan
from stageopt.program.groups import GroupTable
from stageopt.program.nodes import COLL, COMP, COPY, NEXT, RECV, SEND, ProgramNode, StageProgram

SELF, NEXT_RANK, PREV_RANK = -1, -2, -3
_COMM_TYPES = {"all_reduce": CommType.ALL_REDUCE, "all_gather": CommType.ALL_GATHER,
               "reduce_scatter": CommType.REDUCE_SCATTER, "all_to_all": CommType.ALL_TO_ALL}


def compute_micros(program: StageProgram, seconds: np.ndarray) -> np.ndarray:
    """Whole microseconds per node for ``duration_micros``: compute nodes only, 0 elsewhere.

    ASTRA-sim 518bd51 reads an integer number of microseconds. Compute nodes
    form one chain in id order (each waits for the previous), so the running
    sum of their times is rounded, not each time: every node is within 1 us of
    its model time and every point of the stream within 0.5 us, however many
    kernels come before it (rounding each kernel alone would let a stage of
    thousands of 2.4 us kernels drift by 0.4 us each).
    """
    out = np.zeros(len(program.nodes), dtype=np.int64)
    comp = np.array([n.id for n in program.nodes if n.type == COMP], dtype=np.int64)
    if comp.size:
        ends = np.rint(np.cumsum(np.asarray(seconds, dtype=float)[comp] * 1e6))
        out[comp] = np.diff(ends, prepend=0.0).astype(np.int64)
    return out


def chakra_node(n: ProgramNode, duration_micros: int = 0) -> Any:
    """One program node as a Chakra ``Node`` with placeholders for rank-specific fields."""
    common = dict(ctrl_deps=n.ctrl_deps, data_deps=n.data_deps)
    if n.type == COMP:
        return make_node(n.id, n.name, NodeType.COMP_NODE, **common, duration_micros=int(duration_micros),
                         num_ops=n.num_ops,
                         tensor_size=n.tensor_size, is_cpu_op=False)
    if n.type == COLL:
        return make_node(n.id, n.name, NodeType.COMM_COLL_NODE, **common, comm_type=int(_COMM_TYPES[n.collective]),
                         comm_size=n.comm_size, pg_name=n.group, is_cpu_op=False)
    if n.type == COPY:  # a host copy: ASTRA-sim times it with its remote-memory backend, on the CPU slot
        kind = NodeType.MEM_STORE_NODE if n.phase == "offload" else NodeType.MEM_LOAD_NODE
        return make_node(n.id, n.name, kind, **common, tensor_size=n.comm_size, is_cpu_op=True)
    peer = NEXT_RANK if n.peer == NEXT else PREV_RANK
    if n.type == SEND:
        return make_node(n.id, n.name, NodeType.COMM_SEND_NODE, **common, comm_src=SELF, comm_dst=peer,
                         comm_tag=n.tag, comm_size=n.comm_size, is_cpu_op=False)
    assert n.type == RECV
    return make_node(n.id, n.name, NodeType.COMM_RECV_NODE, **common, comm_src=peer, comm_dst=SELF,
                     comm_tag=n.tag, comm_size=n.comm_size, is_cpu_op=False)


def stage_template(program: StageProgram, micros: np.ndarray) -> TraceTemplate:
    """Serialize a stage's nodes once; ``micros`` from :func:`compute_micros`."""
    return TraceTemplate(chakra_node(n, int(m)) for n, m in zip(program.nodes, micros))


def rank_patches(plan: Plan, groups: GroupTable, rank: int) -> dict[str, dict[Any, Any]]:
    """The substitutions that turn a stage template into ``rank``'s trace.

    Ranks are numbered with the pipeline stage outermost, so the same position
    on the next stage is ``ranks_per_stage`` further (wrapping around: the last
    stage's next virtual chunk lives on stage 0 when vpp > 1).
    """
    per_stage = plan.gpus // plan.pp
    stage, local = divmod(rank, per_stage)
    peers = {SELF: rank, NEXT_RANK: ((stage + 1) % plan.pp) * per_stage + local,
             PREV_RANK: ((stage - 1) % plan.pp) * per_stage + local}
    return {"pg_name": groups.ids_of_rank(rank), "comm_src": peers, "comm_dst": peers}
