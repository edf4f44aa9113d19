"""What ``stageopt inspect`` reports: one plain dict per plan, per stage, from the graph.

Plain data (numbers, strings, lists) so ``--json`` prints it as is and tests
compare it with hand derivations; the text rendering is the command's job.
"""

from __future__ import annotations

from stageopt.model.layer_types import is_layer
from stageopt.workload.memory import GIB
from stageopt.workload.sharding import Workload
from stageopt.workload.stats import StageStats, all_stage_stats, flops_per_iteration


def _collectives(stats: StageStats) -> list[dict]:
    return [{"group": c.group, "type": c.kind, "phase": c.phase, "count": c.count, "group_size": c.group_size,
             "bytes_each": c.bytes_each, "bytes_total": c.bytes_total}
            for c in sorted(stats.collectives, key=lambda c: (c.phase, c.group, c.kind, -c.bytes_each))]


def inspect_report(work: Workload) -> dict:
    stats = all_stage_stats(work)
    plan = work.plan
    stages = []
    for s in stats:
        stages.append({
            "stage": s.stage,
            "layers": sum(n for c in work.chunks[s.stage] for k, n in c.blocks.items() if is_layer(k)),
            "ops": s.ops,
            "flops": s.flops,
            "attention_flops": s.attention_flops,
            "vector_flops": s.vector_flops,
            "bytes_accessed": s.bytes_accessed,
            "params_local": s.params_local,
            "collectives": _collectives(s),
            "p2p_bytes": s.p2p_bytes,
            "memory_gib": s.memory.gib(),
        })
    return {
        "model": work.model.name,
        "plan": str(plan),
        "framework": plan.framework.name,
        "gpus": plan.gpus,
        "microbatches": plan.microbatches * plan.flushes,
        "flushes": plan.flushes,
        "params_total": work.params_total,
        "params_active": work.params_active,
        "tokens_per_iteration": plan.gbs * work.model.seq,
        "flops_per_iteration": flops_per_iteration(work, stats),
        "peak_memory_gib": max(s.memory.total for s in stats) / GIB,
        "stages": stages,
    }
