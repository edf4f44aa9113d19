"""Where ASTRA-sim's answer for a plan differs from the replay's by design, said in words.

Why: both backends run the same stage programs with the same kernel times and
the same network tiers (``docs/architecture.md``), so on most plans they agree
to a fraction of a percent. The differences that remain are choices of what
to model, and they depend on the plan; a user comparing ``--backend
astra-sim`` with ``--backend replay`` should read which apply next to the
numbers, not in a paper. Each note names the mechanism and how to reproduce
the other side.
"""

from __future__ import annotations

from collections.abc import Sequence

from stageopt.parallel.plan import Plan
from stageopt.program.nodes import COLL, StageProgram
from stageopt.sim.analytical_schedules import overlaps_iterations

DP_STREAM = ("data-parallel collectives (gradient buckets, ZeRO-3 gathers and scatters) share ASTRA-sim's one "
             "communication slot with TP collectives and pipeline sends; --backend replay runs them on a background "
             "stream as Megatron-LM and FSDP do, slowing the kernels beside them (gpu.efficiency.overlap_slowdown) "
             "(--backend replay --dp-stream shared uses ASTRA-sim's rule)")
TP_OVERLAP = ("TP communication overlapped with GEMMs (tp_overlap=on): replay and analytical keep only the part of "
              "each TP collective that the chunked GEMMs cannot hide; ASTRA-sim runs the chunked GEMMs, then whole "
              "collectives (--backend replay --dp-stream shared uses ASTRA-sim's rule)")
TP_ASYNC = ("backward TP collectives issued beside a GEMM (the stack's tp_async_backward, tp_overlap=off): replay "
            "and analytical keep only what the GEMM leaves exposed; ASTRA-sim runs them whole (--backend replay "
            "--dp-stream shared uses ASTRA-sim's rule)")
SPANNING = ("groups with several GPUs in each of several nodes ({kinds}): replay and analytical price their "
            "collectives as NCCL's multi-channel ring (the smaller of NVLink and the node's NICs); ASTRA-sim runs "
            "them as hierarchical phases on NVLink and scale-out")
RING_ONLY = ("ASTRA-sim runs every communicator group smaller than all GPUs as a ring ({which} use other "
             "algorithms on some tier), while replay uses each tier's algorithm")
PODS = "the job spans pods: replay times two network tiers, ASTRA-sim routes messages between pods over the third"
FLEX = ("dispatcher=flex: replay and analytical send each token once per other node holding one of its experts "
        "(DeepEP / HybridEP); the trace's all-to-all carries every routed copy, so ASTRA-sim prices the plain "
        "all-to-all (replay reproduces it with dispatcher=alltoall)")
A2A_CONTENTION = ("ep_overlap: replay and analytical slow the kernels that run under a combined-1F1B pair's expert "
                  "all-to-alls (gpu.efficiency.a2a_overlap_saving); ASTRA-sim runs them at full speed (replay "
                  "reproduces it with --dp-stream shared)")
POST_VALIDATION = ("the stack bypasses the optimizer's synchronisation (optimizer_post_validation), so successive "
                   "iterations overlap: --backend analytical prices that steady state; replay and ASTRA-sim time "
                   "one iteration from a common start, which keeps the pipeline's fill and drain")
NCCL_PROTOCOLS = ("ring collectives: replay and analytical price each with the protocol NCCL would pick for its size "
                  "(LL, LL128 or Simple, and the tree for an all-reduce across nodes where it is cheaper; the "
                  "hardware's nccl field), ASTRA-sim as one latency-bandwidth ring per tier, which small and "
                  "middle-sized messages feel (--backend replay --dp-stream shared uses ASTRA-sim's rule)")
CONGESTION = ("congestion-aware: ASTRA-sim shares each link between the messages that cross it at once; replay "
              "and analytical do not model contention")


def _collectives_used(programs: Sequence[StageProgram]) -> set[tuple[str, str, str]]:
    """``(phase, group kind, collective)`` of every collective the trace set holds."""
    return {(n.phase, n.group, n.collective) for p in programs for n in p.nodes if n.type == COLL}


def astra_sim_notes(programs: Sequence[StageProgram], plan: Plan, system: dict,
                    network_dims: int, network_model: str, nccl_protocols: bool = False) -> list[str]:
    """The by-design differences from ``--backend replay`` that apply to this plan's written trace set
    (``nccl_protocols``: the hardware prices rings with NCCL's protocol choice)."""
    used = _collectives_used(programs)
    notes = []
    if any(phase in ("dp", "zero3") for phase, _, _ in used):
        notes.append(DP_STREAM)
    if plan.tp_overlap and any(n.overlap for p in programs for n in p.nodes if n.type == COLL):
        notes.append(TP_OVERLAP)
    if plan.framework.tp_async_backward and any(n.async_overlap and not (plan.tp_overlap and n.overlap)
                                               for p in programs for n in p.nodes if n.type == COLL):
        notes.append(TP_ASYNC)
    spanning = sorted({group.split("@")[0] for _, group, _ in used if "@" in group})
    if spanning:
        notes.append(SPANNING.format(kinds=", ".join(spanning)))
    kinds = {collective.replace("_", "-") for _, _, collective in used}
    multi = sorted(k for k in kinds if len(system.get(f"{k}-implementation", [])) > 1
                   and set(system[f"{k}-implementation"]) != {"ring"})
    if multi:
        notes.append(RING_ONLY.format(which=", ".join(multi)))
    if plan.dispatcher == "flex" and any(group.startswith("ep") and c == "all_to_all" for _, group, c in used):
        notes.append(FLEX)
    if plan.ep_overlap and any(group.startswith("ep") and c == "all_to_all" for _, group, c in used):
        notes.append(A2A_CONTENTION)
    if network_dims > 2:
        notes.append(PODS)
    if network_model == "aware":
        notes.append(CONGESTION)
    if overlaps_iterations(plan):
        notes.append(POST_VALIDATION)
    if nccl_protocols and any(c != "all_to_all" for _, _, c in used):
        notes.append(NCCL_PROTOCOLS)
    return notes
