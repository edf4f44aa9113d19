"""Predicted vs measured for published runs: per-row error, per-source MAPE, rank agreement, regret.

Every prediction takes the path of :func:`stageopt.sim.run.simulate_plan`, the
function behind ``stageopt simulate`` (the same workload and hardware builders,
then the analytical simulator). Errors are on throughput (the source's
metric, or 1/time), so a row that is predicted 10% fast reads +10% whatever
its unit. Families are runs of one model on one cluster whose plans differ:
Spearman's rho of predicted against measured throughput says whether the model
ranks plans right, and the top-1 regret how much slower the plan it would
pick ran than the best one measured.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import spearmanr

from stageopt.errors import StageoptError
from stageopt.frameworks import load_profile
from stageopt.frameworks.profile import LOW_PRECISION_RECIPES
from stageopt.hardware import Hardware, apply_hw_overrides
from stageopt.hardware.headroom import memory_fit
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.run import hardware_for, workload_for
from stageopt.validation.flops import source_flops
from stageopt.validation.runs import PublishedRun
from stageopt.workload import Workload


@dataclass(frozen=True)
class Comparison:
    """One run: measured and predicted value in the source's metric, and the throughput error."""

    run: PublishedRun
    measured: float
    predicted: float
    iteration_time_s: float
    tokens_per_iteration: float = 0.0  # global batch x sequence: turns a time into a throughput
    free_gib: float = 0.0  # HBM left per GPU at the predicted peak (negative: the published run "does not fit")

    @property
    def throughput_ratio(self) -> float:
        """Predicted over measured throughput (time metrics inverted)."""
        if self.run.metric == "iteration_time_s":
            return self.measured / self.predicted
        return self.predicted / self.measured

    @property
    def error(self) -> float:
        return self.throughput_ratio - 1.0


@dataclass(frozen=True)
class PreparedRun:
    """A run's workload and hardware, built once (calibration re-prices them many times)."""

    run: PublishedRun
    work: Workload
    hardware: Hardware


def prepare(run: PublishedRun) -> PreparedRun:
    """The workload and hardware ``stageopt simulate`` builds for ``run`` (same functions)."""
    work = workload_for(run.model, run.plan, run.gpus, framework=run.framework, model_set=run.model_set)
    return PreparedRun(run=run, work=work, hardware=hardware_for(run.hardware, run.hw_set))


def predict(run: PublishedRun | PreparedRun, hw_set: Sequence[str] = ()) -> Comparison:
    """Simulate ``run`` as a user would and express the result in its metric.

    ``hw_set`` adds hardware overrides after the row's own (calibration).
    """
    prepared = run if isinstance(run, PreparedRun) else prepare(run)
    run, work = prepared.run, prepared.work
    est = AnalyticalSimulator().evaluate(work, apply_hw_overrides(prepared.hardware, list(hw_set)))
    t = est.iteration_time_s
    if run.metric == "tokens_per_s_per_gpu":
        value = est.tokens_per_s / run.gpus
    elif run.metric == "iteration_time_s":
        value = t
    else:
        tflops = source_flops(work.model, work.plan.gbs, run.flops_formula) / (t * run.gpus) / 1e12
        value = tflops if run.metric == "tflops_per_gpu" else 100 * est.mfu * tflops / est.model_tflops_per_gpu
    gpu = prepared.hardware.gpu
    fit = memory_fit(est.peak_memory_gib, gpu.hbm_gib, gpu.memory_reserve_gib())
    return Comparison(run=run, measured=run.value, predicted=value, iteration_time_s=t,
                      tokens_per_iteration=float(work.plan.gbs * work.model.seq), free_gib=fit["free_gib"])


def predict_all(runs: Iterable[PublishedRun], hw_set_by_hardware: dict[str, Sequence[str]] | None = None
                ) -> tuple[list[Comparison], list[tuple[PublishedRun, str]]]:
    """Comparisons for the runs stageopt accepts, and the runs it refuses with the one-line reason.

    Rows marked inexpressible in the table are refused with their status; a
    row stageopt itself rejects (an :class:`~stageopt.errors.StageoptError`,
    e.g. a plan shape it cannot represent yet) is refused with that message.
    ``hw_set_by_hardware`` adds overrides per hardware preset (calibration).
    """
    extra = hw_set_by_hardware or {}
    done, refused = [], []
    for run in runs:
        if not run.expressible:
            refused.append((run, run.status))
            continue
        try:
            done.append(predict(run, extra.get(run.hardware, ())))
        except StageoptError as err:
            refused.append((run, f"stageopt refuses it: {err}"))
    return done, refused


def mape(comps: Sequence[Comparison]) -> float:
    """Mean absolute percentage error of throughput."""
    return float(100 * np.mean([abs(c.error) for c in comps])) if comps else float("nan")


def by_key(comps: Iterable[Comparison], key) -> dict[str, list[Comparison]]:
    groups: dict[str, list[Comparison]] = defaultdict(list)
    for c in comps:
        groups[key(c)].append(c)
    return dict(groups)


def _throughputs(comps: Sequence[Comparison]) -> tuple[np.ndarray, np.ndarray]:
    """Throughputs to rank plans by: tokens per second for time rows (their global batches may differ)."""
    def rate(c: Comparison, value: float) -> float:
        return c.tokens_per_iteration / value if c.run.metric == "iteration_time_s" else value

    measured = np.array([rate(c, c.measured) for c in comps])
    predicted = np.array([rate(c, c.predicted) for c in comps])
    return measured, predicted


def family_ranking(comps: Sequence[Comparison]) -> dict[str, tuple[int, float, float]]:
    """Per family of >= 3 runs: (runs, Spearman rho, top-1 regret as a fraction)."""
    out = {}
    for name, group in by_key([c for c in comps if c.run.family], lambda c: c.run.family).items():
        if len(group) < 3:
            continue
        measured, predicted = _throughputs(group)
        rho = float(spearmanr(measured, predicted).statistic)
        regret = float(measured.max() / measured[int(np.argmax(predicted))] - 1)
        out[name] = (len(group), rho, regret)
    return out


def precision_pairs(comps: Sequence[Comparison]) -> list[tuple[Comparison, Comparison, float]]:
    """Rows of one source that differ only in precision: ``(bf16 row, low-precision row, gap)``.

    ``gap`` is the low-precision row's throughput error minus the BF16 row's. Both ran the same plan on
    the same stack and cluster, so whatever the two share cancels: a gap far from zero says the model
    misses something that differs between the precisions (a kernel, a cast, an FP8-only collective).
    """
    def setup(c: Comparison) -> str:
        r = c.run
        plan = " ".join(t for t in r.plan.split() if not t.startswith("dtype="))
        return "|".join((r.source, r.model, ",".join(r.model_set), str(r.gpus), plan, r.framework, r.hardware,
                         ",".join(r.hw_set), r.metric))

    def dtype(c: Comparison) -> str:
        return next((t.split("=", 1)[1] for t in c.run.plan.split() if t.startswith("dtype=")), "bf16")

    out = []
    for group in by_key(comps, setup).values():
        high = [c for c in group if dtype(c) == "bf16"]
        out += [(high[0], c, c.error - high[0].error) for c in group if high and dtype(c) in LOW_PRECISION_RECIPES]
    return out


def scale_pairs(comps: Sequence[Comparison]) -> list[tuple[Comparison, Comparison, float]]:
    """Rows of one source that differ only in data parallelism, the global batch growing with it (weak
    scaling): ``(smallest run, larger run, gap)``, ``gap`` the larger run's throughput error minus the
    smallest's.

    Same stack, cluster and work per GPU, so what the two share cancels: a gap that grows with the GPU
    count is a cost of scale the model misses (or charges twice, if negative).
    """
    def setup(c: Comparison) -> str:
        r = c.run
        fields = dict(t.split("=", 1) for t in r.plan.split() if "=" in t)
        per_replica = int(fields.get("gbs", 0)) / max(int(fields.get("dp", 1)), 1)
        plan = " ".join(t for t in r.plan.split() if not t.startswith(("dp=", "gbs=")))
        return "|".join((r.source, r.model, ",".join(r.model_set), plan, f"{per_replica:g}", r.framework,
                         r.hardware, ",".join(r.hw_set), r.metric))

    out = []
    for group in by_key(comps, setup).values():
        smallest = min(group, key=lambda c: c.run.gpus)
        out += [(smallest, c, c.error - smallest.error) for c in group if c.run.gpus > smallest.run.gpus]
    return out


def repeated_setups(comps: Sequence[Comparison]) -> list[tuple[list[Comparison], float, float]]:
    """Rows that describe the same setup (model, GPUs, plan, stack profile, hardware, metric) measured more
    than once, e.g. in successive framework releases: ``(rows, spread, floor)`` per setup.

    ``spread`` is the largest over the smallest measured throughput, minus one. ``floor`` is the lowest
    mean absolute error any single prediction can reach on those rows: the model answers one number for
    one setup, so whatever differs between the measurements (software release, noise) is out of its reach.
    The mean of ``|p/m - 1|`` is piecewise linear and convex in ``p``, so its minimum lies at a measured value.
    """
    def setup(c: Comparison) -> str:
        r = c.run
        return "|".join((r.model, ",".join(r.model_set), str(r.gpus), r.plan, r.framework, r.hardware,
                         ",".join(r.hw_set), r.metric))

    out = []
    for group in by_key(comps, setup).values():
        if len(group) < 2:
            continue
        measured, _ = _throughputs(group)
        floor = min(float(np.mean(np.abs(p / measured - 1))) for p in measured)
        out.append((group, float(measured.max() / measured.min() - 1), floor))
    return sorted(out, key=lambda item: -item[1])


def recipe_repeats(comps: Sequence[Comparison]) -> list[tuple[list[Comparison], float, float]]:
    """Setups measured more than once whose rows differ only in the FP8 scaling recipe (and so escape
    :func:`repeated_setups`): ``(rows from slowest to fastest measured, measured spread, predicted spread)``.

    The recipe moves a step by a few percent of cast work; successive releases of one stack move the same
    plan on the same GPUs by much more (kernel libraries, fusions). The predicted spread is the fastest
    measured row's prediction over the slowest's, minus one: the part of the measured spread the model
    follows.
    """
    def setup(c: Comparison) -> str:
        r = c.run
        zero = Plan.parse(r.plan, framework=load_profile(r.framework)).zero  # the stack's default, spelt out or not
        plan = " ".join([t for t in r.plan.split() if not t.startswith(("fp8_recipe=", "zero="))] + [f"zero={zero}"])
        return "|".join((r.model, ",".join(r.model_set), str(r.gpus), plan, r.framework, r.hardware,
                         ",".join(r.hw_set), r.metric))

    out = []
    for group in by_key(comps, setup).values():
        if len({c.run.plan for c in group}) < 2:
            continue
        measured, predicted = _throughputs(group)
        order = np.argsort(measured)
        rows = [group[i] for i in order]
        slow, fast = order[0], order[-1]
        out.append((rows, float(measured[fast] / measured[slow] - 1), float(predicted[fast] / predicted[slow] - 1)))
    return sorted(out, key=lambda item: -item[1])
