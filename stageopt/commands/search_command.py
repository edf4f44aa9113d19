"""``stageopt search``: find the best parallelization plan (and hardware) of a search space with Optuna.

With no argument it searches the default space (Llama 3 70B on 1,024 H100s) with
TPE on the analytical model, stores the study in ``runs/<study>/`` and prints the
best plan. Exit codes: 0 done, 2 bad input (space, storage, Ray address, no
feasible plan), 130 interrupted (what was told is kept; continue with --resume).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stageopt.search.samplers import SAMPLERS

if TYPE_CHECKING:
    from stageopt.search.driver import SearchLoop
    from stageopt.search.session import SearchOptions, SearchResult


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search plans (and hardware) with Optuna on a simulator",
                       description=__doc__.splitlines()[0])
    p.add_argument("--space", help="shipped space name or YAML file (default: default; see search_spaces/)")
    p.add_argument("--budget", type=int, default=500, help="unique simulations to run (default 500)")
    p.add_argument("--sampler", choices=SAMPLERS, default="auto",
                   help="auto (default): the exact census with the analytical model, census-guided confirmation "
                        "with replay/astra-sim, Optuna on hardware ranges; brute/grid: the census itself; "
                        "tpe/nsga2/gp/cmaes/random: sample anyway")
    p.add_argument("--objectives", help="comma list of time, throughput, cost, mfu (default: the space's)")
    p.add_argument("--backend", help="analytical | replay | astra-sim | astra-sim-aware (congestion-aware binary, "
                                     "1-D networks) | package.module:SimulatorClass (default: the space's)")
    p.add_argument("--screen", choices=("analytical",),
                   help="rank the space with the analytical model and simulate the most promising plans first")
    p.add_argument("--screen-top", type=int, help="plans to take from the screen first (default budget/2)")
    p.add_argument("--workers", type=int, help="Ray workers for replay/astra-sim (default: CPU count)")
    p.add_argument("--ray-address", help="existing Ray cluster (host:port or ray://host:port); default: local Ray")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per simulation before it fails (600)")
    p.add_argument("--astra-sim", help="ASTRA-sim binary (or STAGEOPT_ASTRA_SIM)")
    p.add_argument("--storage", help="Optuna RDB URL (postgresql://..., sqlite:///x.db) or a journal .log path; "
                                     "default runs/<study>/journal.log")
    p.add_argument("--study-name", help="default <space>-<date>-<time>")
    p.add_argument("--runs-dir", default="runs", help="where runs/<study>/ goes (default ./runs)")
    p.add_argument("--resume", action="store_true",
                   help="continue --study-name (trials of workers that died are failed and their plans retried)")
    p.add_argument("--join", action="store_true",
                   help="work on --study-name beside other workers, creating it if absent (no plan is simulated twice)")
    p.add_argument("--seed-plan", action="append", default=[], metavar="PLAN",
                   help='enqueue a known plan first, e.g. "tp=8 pp=4 mbs=1 zero=1" (repeatable)')
    p.add_argument("--seed", type=int, help="sampler seed: reproducible (batch-synchronous when parallel)")
    p.add_argument("--max-asks", type=int, help="cap on trials asked this session (default 20 x budget)")
    p.add_argument("--batch", type=int, default=8, help="candidates asked per analytical batch (default 8)")
    p.add_argument("--reserve-gib", type=float, metavar="GIB",
                   help="HBM kept free per GPU for CUDA context, NCCL and allocator slack (default: the space's "
                        "cluster.reserve_gib, else the hardware's gpu.reserve_gib, else 2 GiB + 3%% of HBM)")
    p.add_argument("--framework", metavar="NAME|FILE", help="framework profile(s) the plans run on (comma list "
                                                             "searches them; default: the space's, else megatron-core)")
    p.add_argument("--top", type=int, default=10, help="plans an exact census records and prints (default 10)")
    p.add_argument("--export-best", metavar="DIR", help="write the best plan's trace bundle (stageopt generate)")
    p.add_argument("--no-plots", action="store_true", help="skip PNG/HTML plots")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(run=run)


def options_from_args(args: argparse.Namespace) -> SearchOptions:
    from stageopt.search.session import SearchOptions

    objectives = tuple(s.strip() for s in args.objectives.split(",")) if args.objectives else None
    return SearchOptions(space=args.space, budget=args.budget, sampler=args.sampler, objectives=objectives,
                         backend=args.backend, screen=args.screen, screen_top=args.screen_top, workers=args.workers,
                         ray_address=args.ray_address, timeout_s=args.timeout, astra_sim=args.astra_sim,
                         storage=args.storage, study_name=args.study_name, runs_dir=args.runs_dir,
                         resume=args.resume, join=args.join, seed_plans=tuple(args.seed_plan), seed=args.seed,
                         max_asks=args.max_asks, batch=args.batch, reserve_gib=args.reserve_gib,
                         framework=args.framework, top=args.top, progress=not args.json)


class LoopProgress:
    """The sampled loop's progress through :mod:`stageopt.console.progress`: simulations against the
    budget, asks and the best so far (a live bar on a terminal, a status line every 15 s in a log)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._stack = contextlib.ExitStack()
        self._bar = None
        self._last = 0.0

    def __call__(self, loop: SearchLoop) -> None:
        from stageopt.console.progress import progress

        if not self.enabled:
            return
        if self._bar is None:
            self._bar = self._stack.enter_context(progress(loop.target, "search", unit="sims"))
        self._bar.update(max(0, min(loop.simulations, loop.target) - self._bar.n))
        now = time.monotonic()
        if now - self._last >= 1.0:  # the best is re-ranked at most once a second
            self._last = now
            self._bar.set_postfix_str(self._tail(loop), refresh=False)

    @staticmethod
    def _tail(loop: SearchLoop) -> str:
        best = loop.best()
        if best and len(loop.objectives) == 1:
            return f"{loop.stats.asks} asks, best {loop.objectives[0].value(best[0].record):.4g}"
        return f"{loop.stats.asks} asks, Pareto front {len(best)}"

    def close(self) -> None:
        self._stack.close()


def run(args: argparse.Namespace) -> int:
    from stageopt.hardware.presets import ranking_accuracy
    from stageopt.search.artifacts import SUMMARY_ATTR, render_table, study_best, write_report
    from stageopt.search.session import run_search
    from stageopt.search.space import resolve_space_path
    from stageopt.serving.serving_space import is_serving_space

    space_path = resolve_space_path(args.space)
    if is_serving_space(space_path):  # a serving question (kind: serving) goes to the serving search
        from stageopt.commands.serve_command import run_search as run_serving_search

        return run_serving_search(args, space_path)

    bar = LoopProgress(not args.json)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # Ray's worker-death notices must not mix into --json
            result = run_search(options_from_args(args), progress=bar)
    finally:
        bar.close()
    best = study_best(result.study, result.objectives, result.backend)
    meta = summary(result)
    result.study.set_user_attr(SUMMARY_ATTR, meta)  # so that 'stageopt report' rebuilds best.json whole
    files = write_report(result.study, result.run_dir, result.objectives, result.backend, meta,
                         plots=not args.no_plots)
    exported = export_best(result, best, Path(args.export_best)) if args.export_best and best else None
    if args.json:
        out = {**meta, "best": [o.record for o in best], "files": files.written, "notes": files.notes}
        if best:
            out["accuracy"] = ranking_accuracy(best[0].record["hardware"])
        if exported:
            out["exported"] = exported
        print(json.dumps(out, indent=1))
        return 0
    s = result.stats
    if result.answer.mode == "exact":
        print(f"study {result.study.study_name}: {meta['trials']} exact trials recorded in {s.elapsed_s:.1f} s")
    else:
        print(f"study {result.study.study_name}: {meta['simulations']} unique simulations ({result.backend}), "
              f"{s.asks} asks ({s.cached} cached, {s.invalid} invalid, {s.oom} over memory, {s.failed} failed) "
              f"in {s.elapsed_s:.1f} s; stopped: {s.stop_reason}")
    for line in result.answer.lines:
        print(line)
    print(render_table(best, result.objectives))
    if result.answer.mode == "exact" and len(result.objectives) == 1 and result.census is not None:
        top = result.census.ranked(result.objectives, args.top)
        if len(top) > 1:
            print(f"top {len(top)} (exact):")
            print("\n".join(render_table(top, result.objectives).splitlines()[:len(top) + 1]))
    if best:
        print(f"accuracy: {ranking_accuracy(best[0].record['hardware'])}")
    print(f"files: {result.run_dir}/ ({', '.join(Path(f).name for f in files.written)}); "
          f"rebuild with 'stageopt report {result.run_dir}'")
    for note in files.notes:
        print(f"note: {note}")
    if exported:
        print(f"best plan's traces: {exported}")
    return 0


def summary(result: SearchResult) -> dict:
    s, census = result.stats, result.census
    return {"study": result.study.study_name, "run_dir": str(result.run_dir), "space": result.space.name,
            "backend": result.backend, "objectives": [o.name for o in result.objectives],
            "mode": result.answer.mode, "lines": result.answer.lines,
            "analytical_best": [o.record for o in result.answer.analytical_best[:1]],
            "simulations": result.answer.simulations, "asks": s.asks, "cached": s.cached,
            "invalid": s.invalid, "over_memory": s.oom, "failed": s.failed, "stop_reason": s.stop_reason,
            "elapsed_s": round(s.elapsed_s, 3), "trials": len(result.study.trials),
            "feasible_plans_in_space": census.n_feasible if census and census.exhaustive else None}


def export_best(result: SearchResult, best: list, out: Path) -> str:
    """Write the best plan's ASTRA-sim trace bundle (as ``stageopt generate`` does)."""
    from stageopt.hardware import apply_hw_overrides, load_hardware
    from stageopt.parallel.plan import Plan
    from stageopt.program.generate import generate
    from stageopt.workload import build_workload

    rec = best[0].record
    preset, *overrides = rec["hardware"].split()
    hw = apply_hw_overrides(load_hardware(preset), overrides)
    plan = Plan.parse(rec["plan"], gpus=rec["gpus"])
    res = generate(build_workload(result.space.model, plan, rec["gpus"]), hw, out)
    return str(res.out_dir)
