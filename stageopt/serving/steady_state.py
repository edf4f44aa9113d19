"""The analytical steady state of a deployment: mean step time, TPOT, TTFT and throughput in closed form.

Why a closed form beside the simulation: a search prices thousands of plans;
the steady state of continuous batching follows from conservation alone.
Per engine, with mean prompt ``I`` and output ``O`` tokens, requests arriving
at ``lam`` per second and steps of ``t`` seconds, the running batch decodes
``b = lam (O - 1) t`` tokens a step and prefills ``p = lam I t`` prompt tokens
(so ``p = b I / (O - 1)`` whatever the rate). The step time ``t(b)`` comes from
the step model at that mix, with every decoding sequence at the mean context
``I + O / 2`` and prompt chunks at half a prompt of prefix; the operating
point is the smallest ``b`` on a grid with ``b >= lam (O - 1) t(b)``. The
engine saturates at ``b_max`` = the smaller of ``max_seqs`` and the KV cache
over the mean context. A request's TTFT is half a step (waiting for the step
boundary) plus the steps its prompt needs at the chunk left beside the
decodes; TPOT is ``t(b)``. A closed loop of ``c`` clients holds ``c`` requests
per deployment. Disaggregated: prefill engines run full chunks, decode engines
decode only, and the KV transfer adds to TTFT. Tails come from the simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stageopt.serving.step_time import StepModel, StepShape
from stageopt.serving.traffic import Traffic


@dataclass(frozen=True)
class SteadyState:
    """Mean figures of a deployment at the traffic's load (or at saturation when it is more)."""

    ttft_s: float
    tpot_s: float
    output_tokens_per_s: float  # whole deployment
    max_output_tokens_per_s: float  # at saturation
    batch: float  # decoding sequences per engine
    saturated: bool
    tpot_at_capacity_s: float  # TPOT with every engine's batch full


@dataclass(frozen=True)
class EngineCurve:
    """Step time against the decoding batch of one engine, at the steady mix of prefill tokens."""

    batch: np.ndarray
    step_s: np.ndarray
    prefill_tokens: np.ndarray
    prompt_s: np.ndarray  # seconds of the steps that prefill a mean prompt beside that batch
    b_max: float


def engine_curve(sm: StepModel, kv_tokens_engine: float, max_seqs: int, max_tokens: int, mean_in: float,
                 mean_out: float, prefill: bool = True) -> EngineCurve:
    ctx = mean_in + mean_out / 2
    b_max = float(max(min(max_seqs, kv_tokens_engine / max(ctx, 1.0)), 0.0))
    b = np.linspace(0.0, max(b_max, 1.0), 257)
    ratio = mean_in / max(mean_out - 1, 1.0) if prefill else 0.0
    p = np.minimum(b * ratio, np.maximum(max_tokens - b, 0.0)) if prefill else np.zeros_like(b)
    chunk = np.minimum(mean_in, np.maximum(p, 1.0))
    pairs = b * ctx + p * (mean_in / 2 + chunk / 2)
    keys = b * ctx + np.where(p > 0, p / chunk * (mean_in / 2 + chunk / 2), 0.0)
    shape = StepShape.of(np.maximum(b + p, 1.0), pairs, keys, np.maximum(b + p / max(mean_in, 1.0), 1.0))
    prompt = prompt_seconds(sm, b, mean_in, mean_out, max_tokens) if prefill else np.zeros_like(b)
    return EngineCurve(batch=b, step_s=sm.step_seconds(shape), prefill_tokens=p, prompt_s=prompt, b_max=b_max)


def operating_point(curve: EngineCurve, lam: float, mean_out: float) -> tuple[float, float, bool]:
    """(batch, step seconds, saturated) for ``lam`` requests/s on one engine."""
    demand = lam * max(mean_out - 1, 0.0) * curve.step_s
    ok = np.nonzero(curve.batch >= demand)[0]
    if len(ok) == 0 or curve.batch[ok[0]] > curve.b_max:
        return curve.b_max, float(curve.step_s[-1]), True
    i = int(ok[0])
    if i == 0:
        return 0.0, float(curve.step_s[0]), False
    # interpolate the crossing of batch and demand between grid points i-1 and i
    g0, g1 = curve.batch[i - 1] - demand[i - 1], curve.batch[i] - demand[i]
    w = g0 / (g0 - g1) if g0 != g1 else 1.0
    b = curve.batch[i - 1] + w * (curve.batch[i] - curve.batch[i - 1])
    return float(b), float(curve.step_s[i - 1] + w * (curve.step_s[i] - curve.step_s[i - 1])), False


def prompt_seconds(sm: StepModel, batch, mean_in: float, mean_out: float, max_tokens: int) -> np.ndarray:
    """Seconds of the steps that prefill a mean prompt in chunks beside ``batch`` decodes (array)."""
    batch = np.atleast_1d(np.asarray(batch, dtype=float))
    chunk = np.clip(max_tokens - batch, 1.0, max(mean_in, 1.0))
    n = np.ceil(mean_in / chunk)
    prefix = chunk * (n - 1) / 2  # mean prefix of the prompt's chunks
    ctx = mean_in + mean_out / 2
    shape = StepShape.of(batch + chunk, batch * ctx + chunk * prefix + chunk * (chunk + 1) / 2,
                         batch * ctx + prefix + chunk, batch + 1)
    return n * sm.step_seconds(shape)


def prefill_figures(sm: StepModel, mean_in: float) -> tuple[float, float]:
    """(seconds of one full prefill step, seconds to prefill a mean prompt) on a prefill-only engine."""
    chunk = float(min(sm.pool.max_tokens, max(mean_in, 1.0)))
    step = float(sm.step_seconds(StepShape.of(chunk, chunk * (chunk + 1) / 2, chunk, 1.0))[0])
    return step, math.ceil(mean_in / chunk) * step


def colocated_state(curve: EngineCurve, engines: int, traffic: Traffic, max_tokens: int) -> SteadyState:
    mean_in, mean_out = traffic.input.mean, traffic.output.mean
    t_sat = float(curve.step_s[-1])
    per_req_steps = max(mean_out - 1, 0.0) + math.ceil(mean_in / max(max_tokens - curve.b_max, 1.0))
    max_rate = curve.b_max / max(per_req_steps * t_sat, 1e-12) if mean_out > 1 else \
        max_tokens / max(mean_in, 1.0) / t_sat
    max_out = engines * max_rate * mean_out
    if traffic.concurrency is not None:
        lam = _closed_loop_rate(curve, traffic.concurrency / engines, mean_in, mean_out, max_tokens)
    elif traffic.offline:
        lam = math.inf
    else:
        lam = traffic.rate / engines
    b, t, saturated = operating_point(curve, lam, mean_out) if math.isfinite(lam) else (curve.b_max, t_sat, True)
    ttft = t / 2 + float(np.interp(b, curve.batch, curve.prompt_s))
    out = engines * (min(lam, max_rate) if math.isfinite(lam) else max_rate) * mean_out
    return SteadyState(ttft_s=ttft, tpot_s=t, output_tokens_per_s=out, max_output_tokens_per_s=max_out,
                       batch=b, saturated=saturated, tpot_at_capacity_s=t_sat)


def _closed_loop_rate(curve: EngineCurve, clients: float, mean_in: float, mean_out: float, max_tokens: int) -> float:
    """Requests/s of ``clients`` requests that each return as soon as they finish (Little's law)."""
    rate = 0.0
    for _ in range(50):
        b, t, _sat = operating_point(curve, rate, mean_out)
        prefill_steps = math.ceil(mean_in / max(max_tokens - b, 1.0))
        cycle = (max(mean_out - 1, 0.0) + prefill_steps + 0.5) * t
        new = clients / cycle
        if abs(new - rate) <= 1e-6 * max(new, 1e-9):
            break
        rate = 0.5 * (rate + new)
    return rate


def disaggregated_state(prefill: tuple[float, float], p_engines: int, decode_curve: EngineCurve, d_engines: int,
                        traffic: Traffic, kv_transfer_s: float) -> SteadyState:
    """``prefill`` is :func:`prefill_figures` of the prefill pool; ``p_engines`` its virtual engines."""
    mean_out = traffic.output.mean
    step_s, prompt_s = prefill
    prefill_rate = p_engines / max(prompt_s, 1e-12)  # prompts/s: each engine prefills one prompt at a time
    t_sat = float(decode_curve.step_s[-1])
    decode_rate = d_engines * decode_curve.b_max / max((mean_out - 1) * t_sat, 1e-12) if mean_out > 1 else math.inf
    max_rate = min(prefill_rate, decode_rate)
    offered = (traffic.rate if traffic.rate is not None else math.inf)
    if traffic.concurrency is not None:
        offered = traffic.concurrency / (prompt_s + kv_transfer_s + max(mean_out - 1, 0) * float(decode_curve.step_s[0]))
    lam = min(offered, max_rate)
    b, t, saturated = operating_point(decode_curve, lam / d_engines, mean_out)
    util = min(lam / prefill_rate, 1.0) if prefill_rate > 0 else 1.0
    wait = prompt_s * util / (2 * max(1 - util, 1e-3))  # M/D/1 mean wait of the prefill queue
    return SteadyState(ttft_s=wait + prompt_s + kv_transfer_s, tpot_s=t, output_tokens_per_s=lam * mean_out,
                       max_output_tokens_per_s=max_rate * mean_out, batch=b,
                       saturated=saturated or offered > max_rate * (1 - 1e-9), tpot_at_capacity_s=t_sat)
