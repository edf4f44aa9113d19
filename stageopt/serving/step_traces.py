"""Per-rank Chakra traces of one prefill step and one decode step of a serving instance.

The same serving blocks the step model prices become trace nodes: one compute
node per kernel (FLOPs and the bytes it moves, weights at the plan's weight
dtype and cache at its KV dtype), one collective node per TP/EP collective of
more than one rank, and the activations sent between pipeline stages. Nodes
run in one stream in graph order (each depends on the one before), which is
how an inference engine launches a step. Serialization reuses the training
lowering: :class:`~stageopt.program.nodes.ProgramNode` records, one template
per stage patched per rank (:mod:`stageopt.program.chakra_emit`), the group
table of a plan of ``tp x pp`` ranks, and ASTRA-sim's configs for the machine.

The prefill step is one mean-length prompt (cut to ``max_tokens``); the decode
step is the steady-state batch (at least one sequence) at the mean context.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stageopt.astrasim.config_writer import write_astra_sim_configs
from stageopt.chakra import TraceTemplate, write_comm_groups
from stageopt.parallel.plan import Plan
from stageopt.program.chakra_emit import chakra_node, rank_patches
from stageopt.program.generate import GROUPS_NAME, prepare_out_dir
from stageopt.program.groups import GroupTable
from stageopt.program.nodes import COLL, COMP, NEXT, PREV, RECV, SEND, ProgramNode, StageProgram
from stageopt.serving.step_time import ACT_BYTES, StepModel, StepShape


class _Stream:
    """Appends nodes, each depending on the previous one."""

    def __init__(self) -> None:
        self.nodes: list[ProgramNode] = []

    def add(self, name: str, type_: str, **fields: object) -> None:
        deps = (len(self.nodes) - 1,) if self.nodes else ()
        self.nodes.append(ProgramNode(len(self.nodes), name, type_, "fwd", data_deps=deps, **fields))  # type: ignore[arg-type]


def _block_nodes(stream: _Stream, sm: StepModel, kind: str, shape: StepShape, label: str) -> None:
    table = sm.tables[kind]
    share = sm.ranks_sharing_attention if kind == "attention" else (sm.pool.ep if kind == "moe" else 1)
    tokens = np.maximum(shape.tokens / share, 1.0)
    fv = table.evaluate(sm._with(kind, S=tokens, T=(shape.pairs / share) / tokens), 1)[:, :, 0]
    bv = table.evaluate(sm._with(kind, S=tokens, T=np.maximum(shape.keys / share, 1.0)), 1)[:, :, 0]
    degree = {"tp": sm.attn_tp if kind == "attention" else sm.pool.tp // (sm.pool.ep if kind == "moe" else 1),
              "ep": sm.pool.ep if kind == "moe" else 1}
    for i, row in enumerate(table.rows):
        if row.kind == "comm":
            size = degree.get(row.axis, 1)
            if size > 1:
                group = "tp" if row.axis == "tp" else "ep"
                comm = int(bv[3, i] / size) if row.collective == "all_gather" else int(bv[3, i])
                stream.add(f"{label}:{row.name}", COLL, collective=row.collective, comm_size=max(comm, 1),
                           group=group, group_size=size)
            continue
        nbytes = bv[1, i] * (sm.wscale if row.kind == "matmul" else 1.0) + bv[2, i] * sm.kvscale + bv[3, i]
        flops = fv[0, i]
        if flops <= 0 or nbytes <= 0:
            continue  # ASTRA-sim cannot time a kernel without FLOPs (see program.stage_program)
        stream.add(f"{label}:{row.name}", COMP, num_ops=int(flops), tensor_size=int(nbytes), kernel=row.kind)


def stage_program(sm: StepModel, shape: StepShape, stage: int) -> StageProgram:
    """One pipeline stage's nodes for one step of ``shape``."""
    s = _Stream()
    pp = sm.pool.pp
    boundary = int(shape.tokens[0] * sm.model.hidden * ACT_BYTES)
    if stage > 0:
        s.add("recv_activations", RECV, comm_size=boundary, peer=PREV, tag=1)
    layers = sm.dense_layers + sm.moe_layers
    for layer in range(layers):
        _block_nodes(s, sm, "attention", shape, f"layer{layer}")
        _block_nodes(s, sm, "moe" if layer >= sm.dense_layers else "mlp", shape, f"layer{layer}")
    if stage == pp - 1:
        _block_nodes(s, sm, "head", StepShape.of(shape.sampled, 0.0, 1.0, shape.sampled), "head")
    else:
        s.add("send_activations", SEND, comm_size=boundary, peer=NEXT, tag=1)
    return StageProgram(stage=stage, nodes=tuple(s.nodes))


def write_step_set(sm: StepModel, shape: StepShape, out: Path) -> Path:
    """Write one step's trace set (every rank of one instance) and ASTRA-sim's configs into ``out``."""
    pool = sm.pool
    plan = Plan(dp=1, tp=pool.tp, pp=pool.pp)
    programs = [stage_program(sm, shape, stage) for stage in range(pool.pp)]
    kinds = set().union(*(p.groups_used() for p in programs)) - {"ep"}
    groups = GroupTable(plan, kinds)
    out = prepare_out_dir(out)
    write_comm_groups(out / GROUPS_NAME, groups.comm_groups())
    write_astra_sim_configs(sm.hw, plan.gpus, out)
    per_stage = plan.gpus // plan.pp
    for stage, program in enumerate(programs):
        template = TraceTemplate(chakra_node(n) for n in program.nodes)
        for local in range(per_stage):
            rank = stage * per_stage + local
            (out / f"workload.{rank}.et").write_bytes(template.render(rank_patches(plan, groups, rank)))
    return out


def write_step_traces(est, out_dir: str | Path) -> dict[str, str]:
    """Prefill and decode step traces of the deployment's first pool (and the decode pool's decode step)."""
    out = Path(out_dir)
    t = est.traffic
    prefill_state, decode_state = est.pools[0], est.pools[-1]
    chunk = float(min(t.input.mean, prefill_state.pool.max_tokens))
    prefill = StepShape.of(chunk, chunk * (chunk + 1) / 2, chunk, 1.0)
    batch = float(max(round(est.steady.batch), 1))
    ctx = t.input.mean + t.output.mean / 2
    decode = StepShape.of(batch, batch * ctx, batch * ctx, batch)
    return {"prefill": str(write_step_set(prefill_state.model, prefill, out / "prefill")),
            "decode": str(write_step_set(decode_state.model, decode, out / "decode"))}
