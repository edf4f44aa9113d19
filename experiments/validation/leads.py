"""The shape of the model's largest remaining misses, measured through the path users run.

The validation README's open leads rest on three diagnostics; this script recomputes them from
published_runs.csv with :func:`stageopt.validation.compare.predict` (the function behind
``stageopt simulate``), so each lead can be rechecked after any change to the cost model:

1. BigScience 181B sweep (Jean Zay A100): the seconds a step takes beyond the prediction, per
   layer and micro-batch of the slowest stage, by tp, dp and micro-batch. A missing cost tied to
   one kernel or message per layer would show as a constant here.
2. MosaicML large scale (H100, FSDP over all GPUs, same work per GPU): step-time growth from 128
   to 512 GPUs, measured against predicted, also per billion parameters.
3. MosaicML on H100: mean signed error with activation recompute on and off.

Errors are on throughput (positive: predicted faster than measured). Run:
python experiments/validation/leads.py [published_runs.csv]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from stageopt.validation import load_runs
from stageopt.validation.compare import Comparison, predict, prepare

HERE = Path(__file__).resolve().parent
SWEEP = "BigScience 181B topology sweep"
LARGE_SCALE = "MosaicML llm-foundry MPT benchmarks (large scale)"


def measured_step_s(c: Comparison) -> float:
    """The measured step time, whatever the row's metric (time rows directly, throughput rows inverted)."""
    return c.iteration_time_s * c.throughput_ratio


def sweep_missing_per_layer_microbatch(comps: list[Comparison]) -> None:
    print(f"1. {SWEEP}: time beyond the prediction per layer and micro-batch of a stage")
    print(f"{'tp':>3} {'dp':>3} {'pp':>3} {'mbs':>4} {'micro-batches':>13} {'measured s':>10} {'predicted s':>11} "
          f"{'error':>7} {'ms per layer x mb':>17}")
    rows = []
    for c in comps:
        plan = prepare(c.run).work.plan
        layers_per_stage = prepare(c.run).work.model.layers / plan.pp
        missing = measured_step_s(c) - c.iteration_time_s
        per = 1e3 * missing / (plan.microbatches * layers_per_stage)
        rows.append((plan.tp, plan.dp, plan.pp, plan.mbs, plan.microbatches, measured_step_s(c), c.iteration_time_s,
                     100 * c.error, per))
    for tp, dp, pp, mbs, m, meas, pred, err, per in sorted(rows):
        print(f"{tp:>3} {dp:>3} {pp:>3} {mbs:>4} {m:>13} {meas:>10.2f} {pred:>11.2f} {err:>+6.1f}% {per:>17.1f}")
    for tp in sorted({r[0] for r in rows}):
        pers = [r[-1] for r in rows if r[0] == tp]
        print(f"   tp {tp}: median {np.median(pers):+.1f} ms per layer x micro-batch over {len(pers)} runs")


def scale_growth(comps: list[Comparison]) -> None:
    print(f"\n2. {LARGE_SCALE}: step-time growth from 128 to 512 GPUs (same micro-batch and batch per GPU)")
    by_model = defaultdict(dict)
    for c in comps:
        by_model[c.run.model_set][c.run.gpus] = c
    print(f"{'model':>6} {'recompute':>9} {'measured ms':>11} {'predicted ms':>12} {'measured ms/B':>13} "
          f"{'predicted ms/B':>14}")
    for pair in sorted(by_model.values(), key=lambda p: prepare(p[128].run).work.params_total):
        if 128 not in pair or 512 not in pair:
            continue
        small, large = pair[128], pair[512]
        billions = prepare(small.run).work.params_total / 1e9
        grow_meas = 1e3 * (measured_step_s(large) - measured_step_s(small))
        grow_pred = 1e3 * (large.iteration_time_s - small.iteration_time_s)
        label = small.run.id.split("-")[2]
        print(f"{label:>6} {prepare(small.run).work.plan.recompute:>9} {grow_meas:>11.0f} {grow_pred:>12.0f} "
              f"{grow_meas / billions:>13.1f} {grow_pred / billions:>14.1f}")


def recompute_split(comps: list[Comparison]) -> None:
    print("\n3. MosaicML on H100: signed error by activation recompute")
    groups = defaultdict(list)
    for c in comps:
        groups[(c.run.source, prepare(c.run).work.plan.recompute)].append(100 * c.error)
    for (source, recompute), errs in sorted(groups.items()):
        print(f"   {source}, recompute {recompute}: {np.mean(errs):+.1f}% mean over {len(errs)} runs "
              f"({min(errs):+.1f} to {max(errs):+.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default=str(HERE / "published_runs.csv"))
    runs = [r for r in load_runs(parser.parse_args().runs) if r.expressible]
    sweep = [predict(r) for r in runs if r.source == SWEEP]
    mosaic = [predict(r) for r in runs if r.source.startswith("MosaicML") and r.hardware.startswith("h100")]
    sweep_missing_per_layer_microbatch(sweep)
    scale_growth([c for c in mosaic if c.run.source == LARGE_SCALE])
    recompute_split(mosaic)


if __name__ == "__main__":
    main()
