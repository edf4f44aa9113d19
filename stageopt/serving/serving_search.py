"""The serving search: every deployment of a serving space, priced exactly, then the tails simulated.

Why enumeration and no sampler: a deployment's steady state costs milliseconds
and the space is a finite product (GPU type x count x mode x instance shapes x
caps x dtypes), so the answer is the census, as the project's rule says. Pool
states and engine curves are shared across instance counts and pairings
(:class:`~stageopt.serving.deployment.PoolCache`), so a space of tens of
thousands of deployments is priced in seconds to a minute.

Then: a deployment is *admissible* when its weights fit, it is not saturated by
the traffic, and its analytical mean TTFT and TPOT are within the SLO (a mean
above the target means its percentile is above it too). Admissible
deployments are ranked by cost per hour (at a fixed traffic, cost per million
tokens ranks the same way), and the request simulation checks the SLO's
percentile on the cheapest ``simulate`` of them, in that order: the best plan
is the cheapest one whose simulated percentiles meet the SLO. The
throughput-latency Pareto front is taken over every deployment that fits:
output tokens/s per GPU at saturation against tokens/s per user (1 / TPOT) at
saturation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from stageopt.errors import InfeasiblePlan
from stageopt.hardware import Hardware, apply_hw_overrides, load_hardware
from stageopt.serving.deployment import PoolCache, ServingEstimate, estimate
from stageopt.serving.serve_plan import Pool, ServePlan
from stageopt.serving.serving_space import ServingSpace


@dataclass(frozen=True)
class Scored:
    """One deployment of the space with its figures (``reason`` says why it is out, if it is)."""

    hardware: str
    plan: ServePlan
    usd_per_hour: float
    est: ServingEstimate | None
    reason: str = ""

    @property
    def fits(self) -> bool:
        return self.est is not None

    @property
    def capacity_per_gpu(self) -> float:
        return self.est.steady.max_output_tokens_per_s / self.plan.gpus if self.est else 0.0

    def row(self) -> dict:
        out: dict = {"hardware": self.hardware, "plan": self.plan.describe(), "gpus": self.plan.gpus,
                     "mode": "disaggregated" if self.plan.disaggregated else "colocated",
                     "usd_per_hour": round(self.usd_per_hour, 4), "reason": self.reason}
        if self.est is not None:
            s = self.est.steady
            out.update(ttft_ms=s.ttft_s * 1e3, tpot_ms=s.tpot_s * 1e3, output_tokens_per_s=s.output_tokens_per_s,
                       tokens_per_s_per_gpu=s.output_tokens_per_s / self.plan.gpus,
                       capacity_tokens_per_s_per_gpu=self.capacity_per_gpu,
                       usd_per_million_tokens=self.est.usd_per_million_tokens, saturated=s.saturated)
        return out


def _pools(space: ServingSpace, role: str) -> Iterator[Pool]:
    p = space.plan
    seqs = p["max_seqs"] if role != "prefill" else (max(p["max_seqs"]),)
    tokens = p["max_tokens"] if role != "decode" else (max(p["max_tokens"]),)
    for tp, pp, ep, dpa, ms, mt in itertools.product(p["tp"], p["pp"], p["ep"], p["dpa"], seqs, tokens):
        if tp % ep == 0 and (ep == 1 or space.model.is_moe) and (not dpa or tp > 1):
            yield Pool(role=role, tp=tp, pp=pp, ep=ep, dpa=dpa, max_seqs=ms, max_tokens=mt)


def enumerate_plans(space: ServingSpace) -> Iterator[ServePlan]:
    """Every deployment of the space on each GPU count (instance counts fill the GPUs exactly)."""
    dtypes = list(itertools.product(space.plan["wdtype"], space.plan["kvdtype"]))
    for gpus, (wdtype, kvdtype) in itertools.product(space.gpus, dtypes):
        if "colocated" in space.plan["mode"]:
            for pool in _pools(space, "both"):
                if gpus % pool.gpus_per_instance == 0:
                    yield ServePlan(pools=(_times(pool, gpus // pool.gpus_per_instance),), wdtype=wdtype, kvdtype=kvdtype)
        if "disaggregated" in space.plan["mode"]:
            for pre, dec in itertools.product(_pools(space, "prefill"), _pools(space, "decode")):
                for xp in range(1, gpus // pre.gpus_per_instance + 1):
                    rest = gpus - xp * pre.gpus_per_instance
                    if rest > 0 and rest % dec.gpus_per_instance == 0:
                        yield ServePlan(pools=(_times(pre, xp), _times(dec, rest // dec.gpus_per_instance)),
                                        wdtype=wdtype, kvdtype=kvdtype)


def _times(pool: Pool, instances: int) -> Pool:
    return Pool(role=pool.role, tp=pool.tp, pp=pool.pp, ep=pool.ep, dpa=pool.dpa, instances=instances,
                max_seqs=pool.max_seqs, max_tokens=pool.max_tokens)


def score_all(space: ServingSpace, progress=None) -> list[Scored]:
    """The analytical steady state of every deployment of the space."""
    out: list[Scored] = []
    for preset in space.hardware:
        hw: Hardware = apply_hw_overrides(load_hardware(preset), list(space.hw_set))
        price = space.prices[preset]
        cache = PoolCache()
        for plan in enumerate_plans(space):
            try:
                est = estimate(space.model, hw, plan, space.traffic, simulate=False, hardware_name=preset,
                               cost_per_gpu_hour=price, cache=cache)
                out.append(Scored(preset, plan, price * plan.gpus, est, _reason(space, est)))
            except InfeasiblePlan as err:
                out.append(Scored(preset, plan, price * plan.gpus, None, f"infeasible: {err}"))
            if progress is not None:
                progress(len(out))
    return out


def _reason(space: ServingSpace, est: ServingEstimate) -> str:
    s, slo = est.steady, space.slo
    if s.saturated:
        return "saturated by the traffic"
    if slo.ttft_ms is not None and s.ttft_s * 1e3 > slo.ttft_ms:
        return f"mean TTFT {s.ttft_s * 1e3:.0f} ms over the SLO"
    if slo.tpot_ms is not None and s.tpot_s * 1e3 > slo.tpot_ms:
        return f"mean TPOT {s.tpot_s * 1e3:.1f} ms over the SLO"
    return ""


def admissible(scored: list[Scored]) -> list[Scored]:
    """Deployments that pass the analytical screen, cheapest first (ties: lower TPOT, then TTFT)."""
    ok = [s for s in scored if s.fits and not s.reason]
    return sorted(ok, key=lambda s: (round(s.usd_per_hour, 6), s.est.steady.tpot_s, s.est.steady.ttft_s))


def simulate_cheapest(space: ServingSpace, ranked: list[Scored], budget: int) -> list[tuple[Scored, ServingEstimate]]:
    """Run the request simulation on the first ``budget`` admissible deployments."""
    done = []
    caches: dict[str, PoolCache] = {}
    for s in ranked[:budget]:
        hw = apply_hw_overrides(load_hardware(s.hardware), list(space.hw_set))
        est = estimate(space.model, hw, s.plan, space.traffic, simulate=True, hardware_name=s.hardware,
                       cost_per_gpu_hour=space.prices[s.hardware], cache=caches.setdefault(s.hardware, PoolCache()))
        done.append((s, est))
    return done


def pareto_front(scored: list[Scored]) -> list[Scored]:
    """Non-dominated deployments on (capacity tokens/s per GPU up, tokens/s per user up), one per point."""
    points: dict[tuple[float, float], Scored] = {}
    for s in scored:
        if not s.fits:
            continue
        key = (round(s.capacity_per_gpu, 6), round(user_rate(s), 6))
        if key not in points or s.plan.gpus < points[key].plan.gpus:
            points[key] = s
    front = []
    for (cap, user), s in points.items():
        if not any(c >= cap and u >= user and (c, u) != (cap, user) for c, u in points):
            front.append(s)
    return sorted(front, key=user_rate)


def user_rate(s: Scored) -> float:
    """Tokens/s one user sees at saturation (1 / TPOT with the batch full)."""
    return 1.0 / s.est.steady.tpot_at_capacity_s if s.est else 0.0
