"""One public function from a serving question to its estimate: what ``stageopt serve`` runs.

Why one function: validation against published serving measurements, the
search and the CLI take the same path (model preset + overrides, serving plan
string, traffic, hardware preset + overrides), so an error measured in a
script is the tool's error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from stageopt.errors import InfeasiblePlan
from stageopt.hardware import Hardware, apply_hw_overrides, load_hardware
from stageopt.hardware.network import p2p_time
from stageopt.model import load_model
from stageopt.model.spec import ModelSpec
from stageopt.serving.kv_memory import InstanceMemory, instance_memory
from stageopt.serving.request_sim import PoolRuntime, SimResult, Simulation
from stageopt.serving.serve_plan import Pool, ServePlan
from stageopt.serving.steady_state import (
    EngineCurve,
    SteadyState,
    colocated_state,
    disaggregated_state,
    engine_curve,
    prefill_figures,
)
from stageopt.serving.step_time import StepModel
from stageopt.serving.step_timer import StepTimer
from stageopt.serving.traffic import Slo, Traffic

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class PoolState:
    pool: Pool
    model: StepModel
    memory: InstanceMemory


@dataclass(frozen=True)
class ServingEstimate:
    """Analytical steady state and (when simulated) the simulated distribution of one deployment."""

    plan: ServePlan
    hardware: str
    gpus: int
    cost_per_gpu_hour: float
    steady: SteadyState
    pools: tuple[PoolState, ...]
    kv_transfer_s: float
    traffic: Traffic
    sim: SimResult | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens/s: measured over the simulated run for a closed loop or offline traffic (what a
        benchmark reports), else the steady state's (the offered load, or the capacity when saturated)."""
        open_loop = self.traffic.rate is not None and not self.traffic.offline
        if self.sim is None or open_loop:
            return self.steady.output_tokens_per_s
        return self.sim.output_tokens_per_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.output_tokens_per_s / self.gpus

    @property
    def usd_per_million_tokens(self) -> float:
        """Cost of a million output tokens at the deployment's throughput under this traffic."""
        rate = self.output_tokens_per_s
        return self.gpus * self.cost_per_gpu_hour / 3600 / rate * 1e6 if rate > 0 else math.inf

    def latency(self, metric: str, q: float) -> float:
        """Seconds at percentile ``q`` from the simulation, else the analytical mean."""
        if self.sim is not None:
            return self.sim.percentile(metric, q)
        return self.steady.ttft_s if metric == "ttft" else self.steady.tpot_s

    def meets(self, slo: Slo) -> bool:
        return slo.met(self.latency("ttft", slo.percentile), self.latency("tpot", slo.percentile))


def kv_transfer_seconds(hw: Hardware, plan: ServePlan, prefill: PoolState, decode: PoolState, tokens: float) -> float:
    """Moving a prompt's KV cache from a prefill instance to a decode instance, every rank in parallel.

    ``link=auto`` uses NVLink when one NVLink domain holds a prefill and a decode
    instance, else the scale-out network; each prefill rank sends its share.
    """
    link = plan.link
    if link == "auto":
        fits = prefill.pool.gpus_per_instance + decode.pool.gpus_per_instance <= hw.node.gpus
        link = "nvlink" if fits else "scaleout"
    ranks = prefill.pool.gpus_per_instance
    total = tokens * prefill.memory.kv_per_token * ranks / prefill.model.ranks_sharing_attention
    stride = 1 if link == "nvlink" else hw.node.gpus
    return float(p2p_time(hw, total / ranks, stride))


def _pool_state(model: ModelSpec, hw: Hardware, pool: Pool, plan: ServePlan) -> PoolState:
    if model.heads % (1 if pool.dpa else pool.tp):
        raise InfeasiblePlan(f"serving plan: tp={pool.tp} does not divide heads={model.heads}; use a divisor")
    if pool.pp > model.layers:
        raise InfeasiblePlan(f"serving plan: pp={pool.pp} exceeds layers={model.layers}")
    if pool.ep > 1 and not model.is_moe:
        raise InfeasiblePlan(f"serving plan: ep={pool.ep} on a dense model; set ep=1")
    if model.is_moe and model.experts % pool.ep:
        raise InfeasiblePlan(f"serving plan: ep={pool.ep} does not divide experts={model.experts}")
    sm = StepModel(model, hw, pool, plan.wdtype, plan.kvdtype)
    mem = instance_memory(sm, hw.gpu.hbm_gib, plan.gpu_mem)
    if not mem.fits:
        raise InfeasiblePlan(f"serving plan {pool.describe()}: weights {mem.weights / 2**30:.1f} GiB + workspace "
                             f"{mem.workspace / 2**30:.1f} GiB leave no room for a KV cache on "
                             f"{hw.gpu.hbm_gib:g} GiB GPUs; raise tp or pp, or use wdtype=fp8")
    return PoolState(pool=pool, model=sm, memory=mem)


class PoolCache:
    """Pool states and engine curves by (machine, instance shape, caps, dtypes): a search reuses them
    across instance counts and pairings (an infeasible shape is remembered as its error)."""

    def __init__(self) -> None:
        self._states: dict[tuple, PoolState | InfeasiblePlan] = {}
        self._curves: dict[tuple, EngineCurve] = {}
        self._prefill: dict[tuple, tuple[float, float]] = {}

    def state(self, model: ModelSpec, hw: Hardware, pool: Pool, plan: ServePlan) -> PoolState:
        key = (id(model), hw, dataclasses.replace(pool, instances=1), plan.wdtype, plan.kvdtype, plan.gpu_mem)
        if key not in self._states:
            try:
                self._states[key] = _pool_state(model, hw, dataclasses.replace(pool, instances=1), plan)
            except InfeasiblePlan as err:
                self._states[key] = err
        found = self._states[key]
        if isinstance(found, InfeasiblePlan):
            raise found
        return dataclasses.replace(found, pool=pool)

    def curve(self, state: PoolState, traffic: Traffic, prefill: bool) -> EngineCurve:
        key = (id(state.model), traffic.input, traffic.output, prefill)
        if key not in self._curves:
            self._curves[key] = engine_curve(state.model, state.memory.kv_tokens / state.pool.pp, state.pool.max_seqs,
                                             state.pool.max_tokens, traffic.input.mean, traffic.output.mean,
                                             prefill=prefill)
        return self._curves[key]

    def prefill(self, state: PoolState, traffic: Traffic) -> tuple[float, float]:
        key = (id(state.model), traffic.input)
        if key not in self._prefill:
            self._prefill[key] = prefill_figures(state.model, traffic.input.mean)
        return self._prefill[key]


def estimate(model: ModelSpec, hw: Hardware, plan: ServePlan, traffic: Traffic, *, simulate: bool = True,
             hardware_name: str = "", cost_per_gpu_hour: float | None = None,
             cache: PoolCache | None = None) -> ServingEstimate:
    """Steady state (always) and the request simulation (when ``simulate``) of one deployment."""
    cache = cache or PoolCache()
    states = tuple(cache.state(model, hw, p, plan) for p in plan.pools)
    mean_in = traffic.input.mean
    transfer = kv_transfer_seconds(hw, plan, states[0], states[1], mean_in) if plan.disaggregated else 0.0
    last = states[-1]
    curve = cache.curve(last, traffic, prefill=not plan.disaggregated)
    if plan.disaggregated:
        first = states[0]
        steady = disaggregated_state(cache.prefill(first, traffic), first.pool.instances * first.pool.pp, curve,
                                     last.pool.instances * last.pool.pp, traffic, transfer)
    else:
        steady = colocated_state(curve, last.pool.instances * last.pool.pp, traffic, last.pool.max_tokens)
    sim = None
    if simulate:
        runtimes = [PoolRuntime(role=s.pool.role, instances=s.pool.instances, pp=s.pool.pp, kv_tokens=s.memory.kv_tokens,
                                max_seqs=s.pool.max_seqs, max_tokens=s.pool.max_tokens,
                                timer=StepTimer(s.model, s.pool.max_tokens, s.pool.max_seqs)) for s in states]
        if plan.disaggregated:
            def transfer_s(tokens: int) -> float:
                return kv_transfer_seconds(hw, plan, states[0], states[1], tokens)
        else:
            def transfer_s(tokens: int) -> float:
                return 0.0
        sim = Simulation(runtimes, traffic, transfer_s, plan.sched).run()
    price = cost_per_gpu_hour if cost_per_gpu_hour is not None else hw.cost_per_gpu_hour
    notes = (f"{sim.rejected} requests longer than an instance's KV cache were dropped",) if sim and sim.rejected else ()
    return ServingEstimate(plan=plan, hardware=hardware_name or hw.name, gpus=plan.gpus, cost_per_gpu_hour=price,
                           steady=steady, pools=states, kv_transfer_s=transfer, traffic=traffic, sim=sim, notes=notes)


def serve_plan(model: str, plan: str, traffic: str, *, hardware: str = "h100-sxm", model_set: Sequence[str] = (),
               hw_set: Sequence[str] = (), simulate: bool = True) -> ServingEstimate:
    """Estimate a deployment from the user's words, exactly as ``stageopt serve`` does."""
    spec = load_model(model, list(model_set))
    hw = apply_hw_overrides(load_hardware(hardware), list(hw_set))
    return estimate(spec, hw, ServePlan.parse(plan), Traffic.parse(traffic), simulate=simulate,
                    hardware_name=hardware)
