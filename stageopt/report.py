"""The inspect report: one dict (for --json) and its readable rendering."""

from __future__ import annotations

from stageopt.memory import GIB
from stageopt.stage_stats import StageStats, all_stage_stats, flops_per_iteration
from stageopt.workload import Workload


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
            "layers": sum(n for c in work.chunks[s.stage] for k, n in c.blocks.items() if k in ("dense", "moe")),
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
        "gpus": plan.gpus,
        "microbatches": plan.microbatches,
        "params_total": work.params_total,
        "params_active": work.params_active,
        "tokens_per_iteration": plan.gbs * work.model.seq,
        "flops_per_iteration": flops_per_iteration(work, stats),
        "peak_memory_gib": max(s.memory.total for s in stats) / GIB,
        "stages": stages,
    }


def _human(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def render_report(rep: dict) -> str:
    lines = [f"model {rep['model']}  gpus {rep['gpus']}  plan: {rep['plan']}",
             f"params {_human(rep['params_total'])} (active {_human(rep['params_active'])})  "
             f"micro-batches/iteration {rep['microbatches']}  tokens/iteration {rep['tokens_per_iteration']:,}",
             f"training FLOPs/iteration (all ranks) {_human(rep['flops_per_iteration'], 'FLOP')}  "
             f"peak memory {rep['peak_memory_gib']:.2f} GiB", ""]
    for st in rep["stages"]:
        f, mem = st["flops"], st["memory_gib"]
        lines.append(f"stage {st['stage']}: {st['layers']} layers, {st['ops']:,} ops/iteration, "
                     f"FLOPs fwd {_human(f['fwd'])} bwd {_human(f['bwd'])} recompute {_human(f['recompute'])}, "
                     f"bytes {_human(st['bytes_accessed'], 'B')}, p2p {_human(st['p2p_bytes'], 'B')}")
        lines.append("  memory GiB: " + "  ".join(f"{k} {v:.2f}" for k, v in mem.items()))
        for c in st["collectives"]:
            lines.append(f"  {c['phase']:>9} {c['group']:>6}({c['group_size']}) {c['type']:<15} "
                         f"x{c['count']:<6} {_human(c['bytes_each'], 'B'):>10} each, {_human(c['bytes_total'], 'B')} total")
    return "\n".join(lines)
