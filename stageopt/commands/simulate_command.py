"""``stageopt simulate``: iteration time, throughput, MFU and memory of one plan."""

from __future__ import annotations

import argparse
import json

from stageopt.commands.arguments import add_hardware_args, add_model_plan_args, hardware_from_args, workload_from_args
from stageopt.commands.inspect_command import add_reserve_arg
from stageopt.errors import ConfigError
from stageopt.hardware import Hardware
from stageopt.hardware.headroom import fit_line, memory_fit
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.base import Estimate, Simulator

BACKENDS = ("analytical", "replay", "astra-sim")


def make_simulator(args: argparse.Namespace) -> Simulator:
    if args.backend == "astra-sim":
        from stageopt.sim.astrasim_backend import AstraSimSimulator

        return AstraSimSimulator(binary=args.astra_sim, timeout_s=args.timeout, network=args.astra_sim_network)
    if args.backend == "replay":
        from stageopt.sim.replay import ReplaySimulator

        return ReplaySimulator(dp_stream=args.dp_stream)
    return AnalyticalSimulator()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="estimate one iteration of a plan on a hardware preset")
    add_model_plan_args(p)
    add_hardware_args(p)
    p.add_argument("--backend", choices=BACKENDS, default="analytical")
    p.add_argument("--astra-sim", dest="astra_sim", metavar="PATH",
                   help="ASTRA-sim analytical binary (default: $STAGEOPT_ASTRA_SIM)")
    p.add_argument("--astra-sim-network", choices=("unaware", "aware"), default="unaware",
                   help="ASTRA-sim's congestion-unaware binary, or the congestion-aware one (1-D networks only: "
                        "at most one scale-up domain; found beside the unaware one or in $STAGEOPT_ASTRA_SIM_AWARE)")
    p.add_argument("--dp-stream", choices=("background", "shared"), default="background",
                   help="replay: DP gradient collectives on their own stream (Megatron-LM) or sharing the one "
                        "communication slot (ASTRA-sim's rules, which also price no all-to-all contention)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before an external simulator is killed")
    add_reserve_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def expected_error(hw: Hardware, args: argparse.Namespace) -> tuple[float | None, str]:
    """The held-out error the hardware preset's calibration left (None where it does not apply) and its line."""
    record = hw.measured_accuracy
    if record is None:
        return None, hw.accuracy_unknown()
    if args.backend != "analytical":
        return None, f"measured for the analytical backend: {record.describe()}"
    return record.held_out_mape, record.describe()


def render(est: Estimate, plan: Plan, fit: dict | None = None, pace: float = 1.0, accuracy: str = "") -> str:
    """The report; ``pace``: how much longer GEMMs and attention take on the slowest of the plan's GPUs;
    ``accuracy``: what the hardware preset's validation leads one to expect of the figures."""
    lines = [f"plan: {plan}",
             f"iteration time   {est.iteration_time_s:10.3f} s      tokens/s {est.tokens_per_s:,.0f}",
             f"model TFLOP/s/GPU {est.model_tflops_per_gpu:9.1f}        MFU {est.mfu:.1%}"
             f"   (with recompute {est.hardware_tflops_per_gpu:.1f})",
             f"peak memory      {est.peak_memory_gib:10.2f} GiB    "
             + (fit_line(fit, "") if fit else ('fits' if est.fits_memory else 'DOES NOT FIT')),
             f"slowest GPU      GEMMs and attention x{pace:.3f} on the slowest of {plan.gpus:,} GPUs"
             " (gpu.efficiency.speed_spread; 0 prices a typical GPU)",
             *([f"accuracy         {accuracy}"] if accuracy else []),
             "time breakdown (s):"]
    lines += [f"  {k:<18} {v:10.4f}" for k, v in est.time_breakdown_s.items()]
    lines.append("memory breakdown (GiB):")
    lines += [f"  {k:<18} {v:10.2f}" for k, v in est.memory_breakdown_gib.items()]
    lines += [f"note: {note}" for note in est.details.get("notes", ())]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    work = workload_from_args(args)
    hw = hardware_from_args(args)
    est = make_simulator(args).evaluate(work, hw)
    if args.reserve_gib is not None and args.reserve_gib < 0:
        raise ConfigError(f"--reserve-gib {args.reserve_gib:g}: must be >= 0 (GiB kept free per GPU)")
    reserve = args.reserve_gib if args.reserve_gib is not None else hw.gpu.memory_reserve_gib()
    fit = memory_fit(est.peak_memory_gib, hw.gpu.hbm_gib, reserve)
    pace = float(hw.gpu.efficiency.slowest_gpu_slowdown(work.plan.gpus))
    error_pct, accuracy = expected_error(hw, args)
    if args.json:
        print(json.dumps({"plan": str(work.plan), "framework": work.plan.framework.name, **est.to_json(),
                          "memory_fit": fit, "slowest_gpu_slowdown": pace, "expected_error_pct": error_pct},
                         indent=1))
    else:
        print(render(est, work.plan, fit, pace, accuracy))
    return 0
