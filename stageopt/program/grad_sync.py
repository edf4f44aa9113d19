"""Data-parallel gradient sync and ZeRO-3 parameter traffic inside a stage program.

Split from :mod:`stageopt.program.stage_program` (which walks the schedule):
this part decides which collectives synchronise gradients and parameters and
what they wait for; see that module's docstring for the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stageopt.parallel.ranks import EMBEDDING_GROUP
from stageopt.program.nodes import COLL
from stageopt.program.params import BlockParams, ceil_div
from stageopt.workload.memory import shard_degrees, shared_embedding_grad_bytes, stage_params
from stageopt.workload.stats import OPTIMIZER_FLOPS_PER_PARAM



@dataclass
class Bucket:
    params: BlockParams
    name: str
    deps: list[int] = field(default_factory=list)


class GradSync:
    """Mixin of the stage builder: ZeRO-3 gathers and scatters, DP buckets, optimizer, ZeRO 1-2 gathers.

    Expects ``plan``, ``work``, ``stage``, ``sizes``, ``params``, ``options``,
    ``b`` (the node builder), ``pending``, ``issued``, ``reductions``, ``dp_groups``
    (the dense and expert reduction groups) and ``replicas`` (with hybrid sharding, the
    group that all-reduces each dense shard across the copies; else "").
    """

    def zero3_gathers(self, kind: str, deps: tuple[int, ...], label: str) -> dict[str, int]:
        """ZeRO-3: gather this block's parameters (per group) once ``deps`` are done (prefetch)."""
        if self.plan.step_zero < 3:
            return {}
        out: dict[str, int] = {}
        for group, pgroup in zip(self.dp_groups, ("dense", "expert")):
            size, params = self.sizes[group], self.params[kind].of_group(group)
            if size > 1 and params:
                out[pgroup] = self.b.add(f"{label}:zero3_gather_{pgroup}", COLL, "zero3", deps,
                                         collective="all_gather", group=group, group_size=size,
                                         comm_size=ceil_div(params * self.plan.weight_bytes, size))
        return out

    def zero3_scatters(self, kind: str, deps: tuple[int, ...], label: str) -> tuple[int, ...]:
        """ZeRO-3: reduce-scatter this block's gradients (per group); the last node of each."""
        if self.plan.step_zero < 3:
            return ()
        out: list[int] = []
        for group in self.dp_groups:
            size, params = self.sizes[group], self.params[kind].of_group(group)
            if size > 1 and params:
                scatter = self.b.add(f"{label}:zero3_scatter_{group}", COLL, "zero3", deps,
                                     collective="reduce_scatter", group=group, group_size=size,
                                     comm_size=params * self.plan.grad_bytes)
                self.reductions.append(self.across_replicas(scatter, group, params, size, "zero3"))
                out.append(self.reductions[-1])
        return tuple(out)

    def across_replicas(self, scatter: int, group: str, params: int, size: int, stream: str) -> int:
        """With hybrid sharding, the all-reduce of a dense shard across the copies after its
        reduce-scatter; returns the node the reduction ends with."""
        if not self.replicas or group != self.dp_groups[0]:
            return scatter
        return self.b.add(f"{self.b.nodes[scatter].name}:replicas", COLL, stream, (scatter,),
                          collective="all_reduce", group=self.replicas, group_size=self.sizes[self.replicas],
                          comm_size=ceil_div(params * self.plan.grad_bytes, size))

    # -- gradient sync -----------------------------------------------------------
    def bucket_block(self, kind: str, where: str, done: tuple[int, ...]) -> None:
        """Add a block's gradients to the open bucket; per-layer buckets are issued at once."""
        p = self.params[kind]
        if self.pending is None:
            self.pending = Bucket(p, f"dp{where}")
        else:
            q = self.pending.params
            self.pending.params = BlockParams(q.dense + p.dense, q.expert + p.expert, q.tp_partial + p.tp_partial)
        self.pending.deps.extend(done)
        if self.options.bucket == "layer":
            self.flush_bucket()

    def flush_bucket(self) -> None:
        """Issue the open bucket once everything that produces its gradients is done."""
        if self.pending is not None:
            self.issue_bucket(self.pending, tuple(sorted(set(self.pending.deps))))
            self.issued.append(self.pending)
            self.pending = None

    def issue_bucket(self, bucket: Bucket, deps: tuple[int, ...]) -> None:
        plan, p = self.plan, bucket.params
        if p.tp_partial and self.sizes["tp"] > 1:
            deps = (self.b.add(f"{bucket.name}:tp_norm_grads", COLL, "dp", deps, collective="all_reduce",
                               group="tp", group_size=self.sizes["tp"], comm_size=p.tp_partial * plan.grad_bytes),)
            self.reductions.append(deps[0])
        if plan.step_zero >= 3:
            return
        kind = plan.grad_sync_kind
        for group in self.dp_groups:
            size, params = self.sizes[group], p.of_group(group)
            if size > 1 and params:
                reduced = self.b.add(f"{bucket.name}:{kind}_{group}", COLL, "dp", deps, collective=kind,
                                     group=group, group_size=size, comm_size=params * plan.grad_bytes)
                self.reductions.append(self.across_replicas(reduced, group, params, size, "dp"))

    def tied_embedding_sync(self) -> None:
        """Input embedding tied to the output layer: the first and the last stage all-reduce its gradient
        once the data-parallel reduction is done, before the optimizer (Megatron's
        ``_allreduce_word_embedding_grads``; DeepSpeed's tied-weight reduction)."""
        size = shared_embedding_grad_bytes(self.work, self.stage)
        if not size:
            return
        deps = tuple(self.reductions) or tuple(self.b.stream_point())
        self.reductions.append(self.b.add("tied_embedding_grads", COLL, "dp", deps, collective="all_reduce",
                                          group=EMBEDDING_GROUP, group_size=2, comm_size=size))

    def finish(self) -> None:
        """Remaining buckets, the optimizer step, then ZeRO 1-2 parameter gathers."""
        if self.pending is not None:
            self.pending.deps.extend(self.b.stream_point())
            self.flush_bucket()
        self.tied_embedding_sync()
        plan = self.plan
        dense, expert = stage_params(self.work, self.stage)
        dense_shard, expert_shard = shard_degrees(self.work)
        updated = dense / dense_shard + expert / expert_shard if plan.step_zero >= 1 else dense + expert
        flops = round(OPTIMIZER_FLOPS_PER_PARAM * updated)
        touched = round(updated * (plan.grad_held_bytes + 2 * plan.optimizer_bytes + plan.weight_bytes))  # states r+w
        opt = self.b.comp("optimizer", "optimizer", list(self.reductions), flops, touched, "vector")
        if plan.step_zero not in (1, 2):
            return
        for bucket in self.issued:
            for group in self.dp_groups:
                size, params = self.sizes[group], bucket.params.of_group(group)
                if size > 1 and params:
                    self.b.add(f"{bucket.name}:all_gather_{group}", COLL, "dp", (opt,), collective="all_gather",
                               group=group, group_size=size, comm_size=ceil_div(params * plan.weight_bytes, size))
