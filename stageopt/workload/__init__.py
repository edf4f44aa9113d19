"""The cost side of the graph: a model sharded by a plan, per pipeline stage.

Owns the per-stage workload (which blocks each stage's chunks hold, their
evaluated costs), the per-stage totals every report and simulator reads
(FLOPs, bytes, collectives, point-to-point traffic) and per-rank peak memory.
Imports ``model``, ``graph`` and ``parallel``; knows nothing of hardware.
"""

from stageopt.workload.memory import GIB, MemoryBreakdown, peak_memory, stage_memory
from stageopt.workload.sharding import Chunk, Workload, build_workload, layer_counts
from stageopt.workload.stats import CollectiveUse, StageStats, all_stage_stats, flops_per_iteration, stage_stats

__all__ = [
    "GIB", "Chunk", "CollectiveUse", "MemoryBreakdown", "StageStats", "Workload",
    "all_stage_stats", "build_workload", "flops_per_iteration", "layer_counts", "peak_memory", "stage_memory",
    "stage_stats",
]
