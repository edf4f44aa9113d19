"""The analytical backend: contract, agreement with inspect's memory, closed-form cases."""

import pytest
from contract import SimulatorContract, work

from stageopt.cli import main
from stageopt.hardware import load_hardware
from stageopt.model import load_model
from stageopt.parallel.plan import Plan
from stageopt.sim.analytical import AnalyticalSimulator
from stageopt.sim.analytical_batch import evaluate_plans
from stageopt.workload import build_workload
from stageopt.workload.memory import peak_memory


class TestAnalyticalContract(SimulatorContract):
    simulator = AnalyticalSimulator()


PLANS = [
    "tp=8 pp=4 mbs=1 gbs=256 zero=1 sp=on recompute=selective",
    "tp=4 pp=8 mbs=2 gbs=256 zero=2 recompute=full",
    "tp=8 pp=8 vpp=2 schedule=interleaved mbs=1 gbs=128 zero=1 sp=on",
    "tp=2 pp=4 cp=2 mbs=1 gbs=64 zero=3 sp=on schedule=gpipe framework=torchtitan",
    "tp=8 pp=1 mbs=1 gbs=64",
    "tp=8 pp=1 mbs=1 gbs=64 cuda_graphs=on",  # batched with the plan above: graphs must split the batch
]


@pytest.mark.parametrize("plan", PLANS)
def test_batch_memory_equals_inspect_memory(plan):
    """The vectorized path and the per-stage schedule walk must agree on the peak."""
    model = load_model("llama3-70b", ["seq=4096"])
    p = Plan.parse(plan, gpus=256)
    res = evaluate_plans(model, load_hardware("h100-sxm"), [p])
    exact = max(m.total for m in peak_memory(build_workload(model, p))) / 2**30
    assert res["mem_total"][0] == pytest.approx(exact, rel=1e-9)


def test_batch_equals_one_by_one():
    model, hw = load_model("llama3-70b"), load_hardware("h100-sxm")
    plans = [Plan.parse(p, gpus=256) for p in PLANS]
    together = evaluate_plans(model, hw, plans)["iteration_time_s"]
    alone = [evaluate_plans(model, hw, [p])["iteration_time_s"][0] for p in plans]
    assert list(together) == pytest.approx(alone, rel=1e-12)


def test_single_gpu_time_is_sum_of_kernels():
    """pp=tp=dp=1: no communication, no bubble; time = compute + optimizer."""
    est = AnalyticalSimulator().evaluate(work("tp=1 pp=1 mbs=1 gbs=2", 1), load_hardware("h100-sxm"))
    t = est.time_breakdown_s
    assert t["exposed_comm"] == 0 and t["pipeline_bubble"] == 0
    assert est.iteration_time_s == pytest.approx(t["compute"] + t["optimizer"])


def test_pipeline_bubble_matches_1f1b_formula():
    """Uniform stages: bubble = (p-1)/m of the steady-state time (Narayanan et al. 2021)."""
    model = load_model("llama3-8b", ["layers=8"])  # 2 layers per stage; embedding/head make ends slower
    est = AnalyticalSimulator().evaluate(build_workload(model, Plan.parse("pp=4 mbs=1 gbs=8")), load_hardware("h100-sxm"))
    t = est.time_breakdown_s
    steady = t["compute"] + t["pipeline_p2p"]
    assert t["pipeline_bubble"] <= (4 - 1) / 8 * steady * 1.0001
    assert t["pipeline_bubble"] > 0


def run_cli(capsys, argv):
    code = main(argv)
    return code, capsys.readouterr()


@pytest.mark.parametrize("extra, word", [
    (["--hardware", "h100"], "h100-sxm"),
    (["--hardware", "nope.yaml"], "nope.yaml"),
    (["--hw-set", "scaleout.bandwith_gbps=100"], "scaleout.bandwidth_gbps"),
    (["--hw-set", "scaleout.bandwidth_gbps=-5"], "scaleout.bandwidth_gbps"),
    (["--hw-set", "gpu.hbm_gib=lots"], "gpu.hbm_gib"),
    (["--hw-set", "node.gpus"], "node.gpus"),
])
def test_simulate_bad_hardware_inputs(capsys, extra, word):
    code, out = run_cli(capsys, ["simulate", "--model", "llama3-8b", "--plan", "tp=8", "--gpus", "8", *extra])
    err = out.err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and word in err, err


def test_simulate_json_keys(capsys):
    import json

    code, out = run_cli(capsys, ["simulate", "--model", "llama3-8b", "--plan", "tp=8", "--gpus", "8", "--json"])
    data = json.loads(out.out)
    assert code == 0
    for key in ("iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_gib",
                "memory_breakdown_gib", "time_breakdown_s"):
        assert key in data
    assert set(data["memory_breakdown_gib"]) == {"weights", "gradients", "optimizer", "activations", "other"}
    for key in ("compute", "exposed_comm", "pipeline_bubble", "optimizer"):
        assert key in data["time_breakdown_s"]
