"""Discrete-event simulation of requests arriving at a deployment: the latency tails.

Why our own event core and not SimPy: the only events are a request arriving,
an engine step finishing and a KV cache landing in the decode pool; each engine
is a scheduler that plans its next step when the last one ends. A heap of
``(time, order, action)`` is the whole core (a dozen lines, deterministic
ordering by insertion), runs ~10x faster than SimPy's generator processes for
this event mix, and adds no dependency.

Engines: each instance of a pool runs ``pp`` virtual engines (each stage works
on one of them at a time, as vLLM's pipeline-parallel scheduler does), with
``1/pp`` of the instance's KV cache each; a step of a virtual engine takes the
whole pipeline's latency. A request goes to the engine with the fewest
requests (join the shortest queue); in a disaggregated deployment it is
prefilled in the prefill pool, its KV cache is sent to the least-loaded decode
engine (time from :mod:`stageopt.hardware.network`), and decoded there.

In a closed loop every client sends at t = 0, so the first wave of requests
(one per client) is left out of the figures when the run has more than two
waves, as benchmark tools measure after a warm-up. Reported per request: TTFT (arrival to first token), TPOT (first to last token
over the tokens after the first, as vLLM's benchmark defines it) and end-to-end
latency; per run: output and total tokens per second over the run.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from stageopt.serving.engine import Engine, Request, StepPlan
from stageopt.serving.step_timer import StepTimer
from stageopt.serving.traffic import Traffic


@dataclass(frozen=True)
class PoolRuntime:
    """What the simulation needs of a pool: its engines' caps, KV capacity and step timer."""

    role: str
    instances: int
    pp: int
    kv_tokens: int  # per instance
    max_seqs: int
    max_tokens: int
    timer: StepTimer


@dataclass(frozen=True)
class SimResult:
    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    output_tokens: int
    input_tokens: int
    duration: float
    preemptions: int
    rejected: int

    def percentile(self, metric: str, q: float) -> float:
        values = getattr(self, metric)
        return float(np.percentile(values, q)) if len(values) else math.nan

    def mean(self, metric: str) -> float:
        values = getattr(self, metric)
        return float(np.mean(values)) if len(values) else math.nan

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.duration if self.duration > 0 else 0.0


class _Core:
    """The event core: a heap of timed actions, run in time order (ties in insertion order)."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.now = 0.0
        self._order = 0

    def at(self, time: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.heap, (time, self._order, action))
        self._order += 1

    def run(self) -> None:
        while self.heap:
            self.now, _, action = heapq.heappop(self.heap)
            action()


class Simulation:
    """One deployment (one or two pools) under one traffic."""

    def __init__(self, pools: list[PoolRuntime], traffic: Traffic, kv_transfer_s: Callable[[int], float],
                 sched: str = "vllm") -> None:
        self.core = _Core()
        self.pools = {p.role: p for p in pools}
        self.engines: dict[str, list[tuple[Engine, StepTimer]]] = {}
        for p in pools:
            self.engines[p.role] = [
                (Engine(f"{p.role}{i}.{v}", p.role, p.kv_tokens // p.pp, p.max_seqs, p.max_tokens, sched), p.timer)
                for i in range(p.instances) for v in range(p.pp)]
        self.first = "prefill" if "prefill" in self.pools else "both"
        self.traffic, self.kv_transfer_s = traffic, kv_transfer_s
        rng = np.random.default_rng(traffic.seed)
        n = traffic.requests
        self.prompts, self.outputs = traffic.input.sample(rng, n), traffic.output.sample(rng, n)
        self.rng = rng
        self.done: list[Request] = []
        self.rejected = 0
        self.issued = 0

    # -- arrivals ------------------------------------------------------------------
    def _new_request(self) -> None:
        i = self.issued
        self.issued += 1
        self._route(Request(rid=i, arrival=self.core.now, prompt=int(self.prompts[i]), output=int(self.outputs[i])),
                    self.first)

    def _schedule_arrivals(self) -> None:
        t = self.traffic
        if t.concurrency is not None:
            for _ in range(min(t.concurrency, t.requests)):
                self.core.at(0.0, self._new_request)
            return
        if t.offline:
            times = np.zeros(t.requests)
        else:
            times = np.cumsum(self.rng.exponential(1.0 / t.rate, t.requests))
        for when in times:
            self.core.at(float(when), self._new_request)

    def _route(self, req: Request, role: str) -> None:
        engine, timer = min(self.engines[role], key=lambda et: et[0].load)
        if not engine.can_ever_fit(req):
            self.rejected += 1
            self._finished(req)
            return
        engine.waiting.append(req)
        self._kick(engine, timer)

    # -- engines -------------------------------------------------------------------
    def _kick(self, engine: Engine, timer: StepTimer) -> None:
        if engine.busy:
            return
        plan = engine.plan_step()
        if plan is None:
            return
        engine.busy = True
        dt = timer.seconds(plan.tokens, plan.pairs, plan.keys, plan.sampled)
        self.core.at(self.core.now + dt, lambda: self._step_done(engine, timer, plan))

    def _step_done(self, engine: Engine, timer: StepTimer, plan: StepPlan) -> None:
        engine.busy = False
        done, handed = engine.finish_step(plan, self.core.now)
        for req in done:
            self.done.append(req)
            self._finished(req)
        for req in handed:
            self.core.at(self.core.now + self.kv_transfer_s(req.prompt), lambda r=req: self._land(r))
        self._kick(engine, timer)

    def _land(self, req: Request) -> None:
        req.computed = req.prompt  # the transferred cache
        req.first_token = self.core.now  # the decode instance streams every token, the first included
        self._route(req, "decode")

    def _finished(self, req: Request) -> None:
        if self.traffic.concurrency is not None and self.issued < self.traffic.requests:
            self._new_request()

    def run(self) -> SimResult:
        self._schedule_arrivals()
        self.core.run()
        reqs = self.done
        if self.traffic.concurrency is not None and len(reqs) > 2 * self.traffic.concurrency:
            # a closed loop starts with every client sending at once; measure after that first wave
            reqs = [r for r in reqs if r.rid >= self.traffic.concurrency]
        ttft = np.array([r.first_token - r.arrival for r in reqs])
        tpot = np.array([(r.finish - r.first_token) / (r.generated - 1) for r in reqs if r.generated > 1])
        e2e = np.array([r.finish - r.arrival for r in reqs])
        start = min((r.arrival for r in reqs), default=0.0)
        end = max((r.finish for r in reqs), default=0.0)
        return SimResult(ttft=ttft, tpot=tpot, e2e=e2e, output_tokens=int(sum(r.generated for r in reqs)),
                         input_tokens=int(sum(r.prompt for r in reqs)), duration=end - start,
                         preemptions=int(sum(r.preempted for r in reqs)), rejected=self.rejected)
