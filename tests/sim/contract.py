"""Contract every Simulator backend satisfies (inherit SimulatorContract in a test module).

Subclasses provide ``simulator`` (an instance) and may narrow ``PLANS`` for speed.
"""

from __future__ import annotations

import pickle

from stageopt.hardware import apply_hw_overrides, load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.workload import build_workload

MODEL = ("llama3-8b", ["layers=4", "seq=2048"])


def work(plan: str, gpus: int):
    return build_workload(load_model(*MODEL), Plan.parse(plan, gpus=gpus), gpus)


class SimulatorContract:
    simulator = None
    hardware = "h100-sxm"

    def hw(self, *overrides: str):
        return apply_hw_overrides(load_hardware(self.hardware), list(overrides))

    def test_tp1_has_no_tp_communication(self):
        est = self.simulator.evaluate(work("tp=1 pp=2 mbs=1 gbs=16", 8), self.hw())
        assert est.time_breakdown_s["exposed_tp_comm"] == 0.0

    def test_more_bandwidth_is_never_slower(self):
        w = work("tp=4 pp=2 mbs=1 gbs=32", 32)
        base = self.simulator.evaluate(w, self.hw()).iteration_time_s
        faster_net = self.simulator.evaluate(w, self.hw("scaleout.bandwidth_gbps=400")).iteration_time_s
        faster_nvlink = self.simulator.evaluate(w, self.hw("node.bandwidth_gbps=900")).iteration_time_s
        assert faster_net <= base and faster_nvlink <= base

    def test_more_compute_is_never_slower(self):
        w = work("tp=2 pp=2 mbs=1 gbs=16", 16)
        assert (self.simulator.evaluate(w, self.hw("gpu.peak_tflops=2000")).iteration_time_s
                <= self.simulator.evaluate(w, self.hw()).iteration_time_s)

    def test_results_are_deterministic_and_pickle(self):
        w = work("tp=2 pp=2 mbs=1 gbs=16 zero=1", 16)
        a = self.simulator.evaluate(w, self.hw())
        b = self.simulator.evaluate(w, self.hw())
        assert a == b
        assert pickle.loads(pickle.dumps(a)) == a

    def test_doubling_gpus_at_fixed_batch_never_raises_per_gpu_work(self):
        small = self.simulator.evaluate(work("tp=2 pp=2 mbs=1 gbs=64", 16), self.hw())
        big = self.simulator.evaluate(work("tp=2 pp=2 mbs=1 gbs=64", 32), self.hw())
        work_small = small.hardware_tflops_per_gpu * small.iteration_time_s
        work_big = big.hardware_tflops_per_gpu * big.iteration_time_s
        assert work_big <= work_small * (1 + 1e-9)

    def test_breakdown_adds_up_to_iteration_time(self):
        est = self.simulator.evaluate(work("tp=2 pp=4 mbs=1 gbs=64 zero=1", 32), self.hw())
        parts = {k: v for k, v in est.time_breakdown_s.items() if k != "exposed_comm"}
        assert sum(parts.values()) == __import__("pytest").approx(est.iteration_time_s, rel=1e-6)
