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
from stageopt.parallel.ranks import all_groups
from stageopt.program.groups import members_per_node
from stageopt.program.nodes import COLL, StageProgram

DP_STREAM = ("DP gradient collectives share ASTRA-sim's one communication slot with TP collectives and pipeline "
             "sends; --backend replay runs them on a background stream as Megatron-LM does "
             "(--backend replay --dp-stream shared uses ASTRA-sim's rule)")
ZERO3_IN_NODE = ("ZeRO-3 gathers and scatters: replay and analytical price them as one ring at the scale-out NIC "
                 "bandwidth (as they ran in Narayanan et al. 2021), ASTRA-sim on the links of the group, NVLink "
                 "between the {n} members that share a node")
RING_ONLY = ("ASTRA-sim runs every communicator group smaller than all GPUs as a ring ({which} use other "
             "algorithms on some tier), while replay uses each tier's algorithm")
PODS = "the job spans pods: replay times two network tiers, ASTRA-sim routes messages between pods over the third"
CONGESTION = ("congestion-aware: ASTRA-sim shares each link between the messages that cross it at once; replay "
              "and analytical do not model contention")


def _collectives_used(programs: Sequence[StageProgram]) -> set[tuple[str, str, str]]:
    """``(phase, group kind, collective)`` of every collective the trace set holds."""
    return {(n.phase, n.group, n.collective) for p in programs for n in p.nodes if n.type == COLL}


def astra_sim_notes(programs: Sequence[StageProgram], plan: Plan, node_gpus: int, system: dict,
                    network_dims: int, network_model: str) -> list[str]:
    """The by-design differences from ``--backend replay`` that apply to this plan's written trace set."""
    used = _collectives_used(programs)
    notes = []
    if any(phase == "dp" for phase, _, _ in used):
        notes.append(DP_STREAM)
    shared = {members_per_node(all_groups(plan, group), node_gpus) for phase, group, _ in used if phase == "zero3"}
    if any(n > 1 for n in shared):
        notes.append(ZERO3_IN_NODE.format(n=max(shared)))
    kinds = {collective.replace("_", "-") for _, _, collective in used}
    multi = sorted(k for k in kinds if len(system.get(f"{k}-implementation", [])) > 1
                   and set(system[f"{k}-implementation"]) != {"ring"})
    if multi:
        notes.append(RING_ONLY.format(which=", ".join(multi)))
    if network_dims > 2:
        notes.append(PODS)
    if network_model == "aware":
        notes.append(CONGESTION)
    return notes
