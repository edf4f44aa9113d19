"""``stageopt serve``: estimate one serving deployment (TTFT, TPOT, throughput, cost) under a traffic.

Prints the analytical steady state and the simulated p50/p90/p99 latencies;
``--traces DIR`` also writes per-rank Chakra traces of one prefill step and one
decode step (ASTRA-sim inputs) for the deployment's first pool.
"""

from __future__ import annotations

import argparse
import json
import math


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="estimate a serving deployment: TTFT, TPOT, tokens/s per GPU, $ per Mtok",
                       description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="preset name, model YAML, or Hugging Face config.json")
    p.add_argument("--set", dest="model_set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model field (repeatable)")
    p.add_argument("--plan", required=True,
                   help='e.g. "tp=8 x=2 max_seqs=256 max_tokens=8192" or '
                        '"prefill: tp=8 x=1 | decode: tp=8 x=2 max_seqs=512" (wdtype=, kvdtype=, link=)')
    p.add_argument("--traffic", required=True,
                   help='e.g. "rate=4 input=1024 output=256 requests=1000" or "concurrency=64 input=normal:2048:512 ..."')
    p.add_argument("--slo", help='e.g. "ttft_ms=2000 tpot_ms=50 percentile=90": say whether the deployment meets it')
    p.add_argument("--hardware", default="h100-sxm", help="hardware preset or YAML file (default h100-sxm)")
    p.add_argument("--hw-set", dest="hw_set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hardware field (repeatable)")
    p.add_argument("--no-sim", action="store_true", help="analytical steady state only (no request simulation)")
    p.add_argument("--traces", metavar="DIR", help="write Chakra traces of a prefill and a decode step to DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def result_dict(est, slo=None) -> dict:
    """The JSON form of a :class:`~stageopt.serving.deployment.ServingEstimate`."""
    s = est.steady
    out = {"plan": est.plan.describe(), "hardware": est.hardware, "gpus": est.gpus,
           "analytical": {"ttft_ms": s.ttft_s * 1e3, "tpot_ms": s.tpot_s * 1e3,
                          "output_tokens_per_s": s.output_tokens_per_s,
                          "max_output_tokens_per_s": s.max_output_tokens_per_s, "batch_per_engine": s.batch,
                          "saturated": s.saturated},
           "output_tokens_per_s": est.output_tokens_per_s, "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
           "usd_per_million_tokens": est.usd_per_million_tokens, "kv_transfer_ms": est.kv_transfer_s * 1e3,
           "memory_gib_per_gpu": {p.pool.role: p.memory.as_gib() for p in est.pools},
           "kv_cache_tokens_per_instance": {p.pool.role: p.memory.kv_tokens for p in est.pools},
           "notes": list(est.notes)}
    if est.sim is not None:
        out["simulated"] = {f"{m}_ms": {"mean": est.sim.mean(m) * 1e3,
                                         **{f"p{q}": est.sim.percentile(m, q) * 1e3 for q in (50, 90, 99)}}
                            for m in ("ttft", "tpot", "e2e")}
        out["simulated"].update(requests=len(est.sim.e2e), preemptions=est.sim.preemptions,
                                rejected=est.sim.rejected, output_tokens_per_s=est.sim.output_tokens_per_s)
    if slo is not None:
        out["slo"] = {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "percentile": slo.percentile,
                      "met": est.meets(slo)}
    return out


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:,.1f}"


def run(args: argparse.Namespace) -> int:
    from stageopt.serving.deployment import serve_plan
    from stageopt.serving.traffic import slo_from_dict

    slo = None
    if args.slo:
        slo = slo_from_dict(dict(item.partition("=")[::2] for item in args.slo.split()), "--slo")
    est = serve_plan(args.model, args.plan, args.traffic, hardware=args.hardware, model_set=args.model_set,
                     hw_set=args.hw_set, simulate=not args.no_sim)
    out = result_dict(est, slo)
    if args.traces:
        from stageopt.serving.step_traces import write_step_traces

        out["traces"] = write_step_traces(est, args.traces)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    a = out["analytical"]
    print(f"{out['plan']} on {out['gpus']} x {est.hardware}")
    for role, mem in out["memory_gib_per_gpu"].items():
        print(f"  {role}: per GPU weights {mem['weights']:.1f} GiB, KV cache {mem['kv_cache']:.1f} GiB "
              f"({out['kv_cache_tokens_per_instance'][role]:,} tokens per instance)")
    print(f"analytical: TTFT {_fmt(a['ttft_ms'])} ms, TPOT {a['tpot_ms']:.2f} ms, "
          f"{_fmt(a['output_tokens_per_s'])} output tok/s (max {_fmt(a['max_output_tokens_per_s'])})"
          + (" - saturated" if a["saturated"] else ""))
    if "simulated" in out:
        sim = out["simulated"]
        for m in ("ttft", "tpot", "e2e"):
            q = sim[f"{m}_ms"]
            print(f"simulated {m.upper():5s} mean {_fmt(q['mean'])} ms, p50 {_fmt(q['p50'])} ms, p90 {_fmt(q['p90'])} ms, "
                  f"p99 {_fmt(q['p99'])} ms")
    print(f"throughput {_fmt(out['output_tokens_per_s'])} output tok/s = {_fmt(out['tokens_per_s_per_gpu'])} per GPU; "
          f"${out['usd_per_million_tokens']:.3f} per million output tokens")
    if slo is not None:
        print(f"SLO p{slo.percentile:g} (TTFT {slo.ttft_ms} ms, TPOT {slo.tpot_ms} ms): "
              f"{'met' if out['slo']['met'] else 'NOT met'}")
    for note in out["notes"]:
        print(f"note: {note}")
    if "traces" in out:
        print(f"traces: {out['traces']['prefill']} and {out['traces']['decode']}")
    return 0


def run_search(args: argparse.Namespace, path) -> int:
    """``stageopt search --space F`` for a serving space (``kind: serving``): enumerate, screen, simulate."""
    import time
    from datetime import datetime
    from pathlib import Path

    from stageopt.serving.serving_report import simulated_row, write_report
    from stageopt.serving.serving_search import admissible, pareto_front, score_all, simulate_cheapest
    from stageopt.serving.serving_space import load_serving_space

    start = time.monotonic()
    space = load_serving_space(Path(path))
    scored = score_all(space)
    ranked = admissible(scored)
    budget = space.simulate
    checked = simulate_cheapest(space, ranked, budget)
    rows = [simulated_row(s, est, space) for s, est in checked]
    best_pair = next(((s, est) for s, est in checked if est.meets(space.slo)), None)
    best = None
    if best_pair is not None:
        best = {**simulated_row(*best_pair, space), "tokens_per_s_per_gpu": best_pair[1].tokens_per_s_per_gpu}
    front = pareto_front(scored)
    name = args.study_name or f"{space.name}-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = Path(args.runs_dir) / name
    written, notes = write_report(run_dir, space, scored, rows, best, front, plots=not args.no_plots)
    summary = {"study": name, "run_dir": str(run_dir), "space": space.name, "kind": "serving",
               "deployments": len(scored), "fit": sum(s.fits for s in scored), "admissible": len(ranked),
               "simulated": len(checked), "elapsed_s": round(time.monotonic() - start, 2), "best": best,
               "pareto_front": [s.row() for s in front], "files": written, "notes": notes}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    slo = space.slo
    print(f"serving space {space.name}: {len(scored)} deployments priced exactly, {summary['fit']} fit in memory, "
          f"{len(ranked)} pass the analytical SLO screen; {len(checked)} simulated "
          f"({space.traffic.describe()}) in {summary['elapsed_s']:.1f} s")
    if best is None:
        print(f"no deployment meets TTFT p{slo.percentile:g} <= {slo.ttft_ms} ms and TPOT <= {slo.tpot_ms} ms "
              f"among the {len(checked)} cheapest admissible; see {run_dir}/simulated.csv")
    else:
        print(f"best: {best['plan']} on {best['gpus']} x {best['hardware']}: ${best['usd_per_hour']:.2f}/h, "
              f"${best['usd_per_million_tokens']:.3f} per million output tokens, "
              f"TTFT p{slo.percentile:g} {best['ttft_at_slo_percentile_ms']:.0f} ms, "
              f"TPOT p{slo.percentile:g} {best['tpot_at_slo_percentile_ms']:.1f} ms")
    print(f"throughput-latency Pareto front ({len(front)} deployments, at saturation):")
    for s in front:
        r = s.row()
        print(f"  {r['capacity_tokens_per_s_per_gpu']:8.0f} tok/s/GPU  TPOT {s.est.steady.tpot_at_capacity_s * 1e3:6.1f} ms"
              f"  {s.hardware}  {r['plan']}")
    print(f"files: {run_dir}/ (candidates.csv, simulated.csv, best.json{', pareto.png, cost.png' if not args.no_plots else ''})")
    for note in notes:
        print(f"note: {note}")
    return 0
