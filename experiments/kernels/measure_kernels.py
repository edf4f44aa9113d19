"""Time the kernels a training step launches on one real GPU (needs PyTorch and a CUDA GPU).

Why: every backend prices kernels with one model (stageopt/hardware/kernels.py) whose
parameters are physical: the share of peak a GEMM tile reaches, the tile and wave
quantization, the HBM bandwidth a streaming kernel reaches, the flash-attention
shares. This script measures those kernels directly, on the shapes real plans
launch, so `compare_kernels.py` can check the model's shape curve against the
hardware rather than against end-to-end step times alone.

    python experiments/kernels/measure_kernels.py --out experiments/kernels/h200
    python experiments/kernels/measure_kernels.py --out /tmp/k --quick --device cpu   # smoke test

Writes gemm.csv, grouped.csv, memory.csv, attention.csv, sustained.csv (and contention.csv with
--steps contention) and device.json.
Each row is flushed as it is measured, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import time

import torch
import torch.nn.functional as F

# (name, hidden, ffn, query heads, kv heads, head dim, gated MLP): the dense models of the validation set
MODELS = [("llama3-8b", 4096, 14336, 32, 8, 128, True), ("llama3-70b", 8192, 28672, 64, 8, 128, True),
          ("llama3-405b", 16384, 53248, 128, 8, 128, True), ("gpt3-175b", 12288, 49152, 96, 96, 128, False)]


class Timer:
    """Median seconds of one call, from CUDA events around back-to-back repetitions.

    Before each measurement a large GEMM runs for ``heat_seconds``: a GPU that has
    been idle for a moment runs its first milliseconds at a higher clock than the
    power limit lets it hold, and training keeps the GPU busy. ``clock`` holds the
    SM clock and power read just after the measurement.
    """

    def __init__(self, device: str, min_seconds: float, heat_seconds: float = 0.0):
        self.cuda = device == "cuda"
        self.min_seconds = min_seconds
        self.heat_seconds = heat_seconds if self.cuda else 0.0
        self.clock: dict = {}
        if self.heat_seconds:
            a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
            self.heater = lambda: a @ a

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _batch(self, fn, reps: int) -> float:
        if not self.cuda:
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - start) / reps
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e-3 / reps

    def __call__(self, fn) -> float:
        fn()
        self.sync()
        if self.heat_seconds:
            self._batch(self.heater, max(int(self.heat_seconds / 1.2e-3), 1))
        once = max(sorted(self._batch(fn, 1) for _ in range(3))[1], 1e-7)  # one stalled call sets no count
        reps = int(min(max(self.min_seconds / 5 / once, 1), 500))
        samples = sorted(self._batch(fn, reps) for _ in range(5))
        self.clock = nvml_reading()
        return samples[2]


class Sink:
    """CSV files under one folder, one per table, each row flushed at once."""

    def __init__(self, out: pathlib.Path):
        self.out, self.files = out, {}
        out.mkdir(parents=True, exist_ok=True)

    def write(self, table: str, row: dict):
        if table not in self.files:
            handle = open(self.out / f"{table}.csv", "w", newline="")
            writer = csv.DictWriter(handle, fieldnames=list(row), extrasaction="ignore")
            writer.writeheader()
            self.files[table] = (handle, writer)
        handle, writer = self.files[table]
        writer.writerow(row)
        handle.flush()


def training_gemms(tokens_list, tps):
    """Forward, data-gradient and weight-gradient GEMMs of each model's layer at each tp and token count."""
    seen = set()
    for name, h, ffn, hq, hkv, d, gated in MODELS:
        for tp in tps:
            for m in tokens_list:
                layer = {"qkv": ((hq + 2 * hkv) * d // tp, h), "proj": (h, hq * d // tp),
                         "fc1": ((2 if gated else 1) * ffn // tp, h), "fc2": (h, ffn // tp)}
                for op, (n, k) in layer.items():
                    for role, shape in (("fwd", (m, n, k)), ("dgrad", (m, k, n)), ("wgrad", (n, k, m))):
                        if (role, shape) not in seen:
                            seen.add((role, shape))
                            yield f"{name}/tp{tp}/{op}", role, shape


def sweep_gemms(quick: bool):
    """Shapes that expose tile and wave quantization, short k, and small expert GEMMs."""
    scale = 16 if quick else 1
    for n in range(128, 4096 + 1, 128 * scale):
        yield "sweep_n", "fwd", (8192 // scale, n, 4096 // scale)
    for m in range(128, 4096 + 1, 128 * scale):
        yield "sweep_m", "fwd", (m, 8192 // scale, 4096 // scale)
    for side in (2048, 4096, 8192):
        for k in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):
            yield "sweep_k", "fwd", (side // scale, side // scale, k // scale)
    for m in (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
        for name, n, k in (("expert_qwen3_30b", 1536, 2048), ("expert_dsv3", 4096, 7168)):
            yield name, "fwd", (max(m // scale, 1), n // scale, k // scale)


def gemm_call(role: str, m: int, n: int, k: int, dtype, device: str, fp8: bool):
    """A closure computing one (m x k) @ (k x n) product in the operand layout the role has in training."""
    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)
    if fp8:
        a = rand(m, k).to(torch.float8_e4m3fn)
        b = rand(n, k).to(torch.float8_e4m3fn).t()  # column-major k x n, as _scaled_mm requires
        one = torch.ones((), device=device, dtype=torch.float32)
        fast = role == "fwd"  # Transformer Engine's recipe: split accumulation for the gradient GEMMs only
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=fast)
    if role == "fwd":  # y = x W^T
        x, w = rand(m, k), rand(n, k)
        return lambda: F.linear(x, w)
    if role == "dgrad":  # dx = dy W, with W stored n x k: here (m x k) @ (k x n) of the stored (k x n) weight
        g, w = rand(m, k), rand(k, n)
        return lambda: torch.mm(g, w)
    g, x = rand(k, m), rand(k, n)  # dW = dy^T x: contraction over the tokens
    return lambda: torch.mm(g.t(), x)


def measure_gemms(sink: Sink, timer: Timer, device: str, quick: bool, fp8_ok: bool):
    tokens = [256] if quick else [2048, 8192]
    tps = [8] if quick else [1, 2, 4, 8]
    shapes = list(training_gemms(tokens, tps)) if not quick else list(training_gemms(tokens, tps))[:6]
    shapes += list(sweep_gemms(quick))
    for label, role, (m, n, k) in shapes:
        for fp8 in ((False, True) if fp8_ok else (False,)):
            if fp8 and (m % 16 or n % 16 or k % 16):
                continue
            try:
                seconds = timer(gemm_call(role, m, n, k, torch.bfloat16, device, fp8))
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                print(f"gemm {label} {role} {(m, n, k)} fp8={fp8}: {str(exc).splitlines()[0]}")
                continue
            sink.write("gemm", {"label": label, "role": role, "dtype": "fp8" if fp8 else "bf16", "m": m, "n": n,
                                "k": k, "seconds": f"{seconds:.4e}",
                                "tflops": f"{2 * m * n * k / seconds / 1e12:.1f}", **timer.clock})
        if device == "cuda":
            torch.cuda.empty_cache()


def measure_grouped(sink: Sink, timer: Timer, device: str, quick: bool):
    """Grouped expert GEMMs (torch._grouped_mm, the kernel MoE stacks call) at small tokens per expert."""
    if not hasattr(torch, "_grouped_mm"):
        print("grouped: torch._grouped_mm missing")
        return
    for experts, n, k in ((16, 1536, 2048), (8, 4096, 7168), (32, 1536, 2048)):
        for per in (16, 64, 128, 256, 512, 1024, 2048):
            if quick:
                experts, n, k, per = 2, 64, 64, 16
            a = torch.randn(experts * per, k, device=device, dtype=torch.bfloat16)
            b = torch.randn(experts, n, k, device=device, dtype=torch.bfloat16).transpose(-2, -1)
            offs = torch.arange(per, experts * per + 1, per, device=device, dtype=torch.int32)
            try:
                seconds = timer(lambda: torch._grouped_mm(a, b, offs=offs, out_dtype=torch.bfloat16))
            except RuntimeError as exc:
                print(f"grouped {experts}x{per} {n}x{k}: {str(exc).splitlines()[0]}")
                return
            sink.write("grouped", {"experts": experts, "tokens_per_expert": per, "n": n, "k": k,
                                   "seconds": f"{seconds:.4e}",
                                   "tflops": f"{2 * experts * per * n * k / seconds / 1e12:.1f}"})
            if quick:
                return


def memory_ops(rows: int, cols: int, device: str):
    """(name, closure, bytes read + written) for the elementwise kernels of a layer, bf16 (rows x cols)."""
    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)
    x, y, w = rand(rows, cols), rand(rows, cols), rand(cols)
    e = 2 * rows * cols  # bytes of one bf16 tensor
    ops = [("copy", lambda: x.clone(), 2 * e), ("add", lambda: x + y, 3 * e), ("silu", lambda: F.silu(x), 2 * e),
           ("silu_mul_eager", lambda: F.silu(x) * y, 5 * e),
           ("rms_norm", lambda: F.rms_norm(x, (cols,), w), 2 * e),
           ("layer_norm", lambda: F.layer_norm(x, (cols,), w, w), 2 * e),
           ("softmax", lambda: torch.softmax(x, dim=-1), 2 * e),
           ("dropout", lambda: F.dropout(x, 0.1, training=True), 2 * e + e // 2),
           ("cast_fp8", lambda: x.to(torch.float8_e4m3fn), e + e // 2)]
    return ops


def measure_memory(sink: Sink, timer: Timer, device: str, quick: bool):
    for power in (range(10, 14) if quick else range(18, 31)):  # copy over a size sweep: where launch stops mattering
        x = torch.randn(2 ** power, device=device, dtype=torch.bfloat16)
        seconds = timer(lambda: x.clone())
        sink.write("memory", {"op": "copy", "rows": 1, "cols": x.numel(), "bytes": 4 * x.numel(),
                              "seconds": f"{seconds:.4e}", "gbps": f"{4 * x.numel() / seconds / 1e9:.0f}"})
    rows, cols = (64, 256) if quick else (65536, 8192)  # 1 GiB per tensor
    for name, fn, nbytes in memory_ops(rows, cols, device):
        try:
            seconds = timer(fn)
        except (RuntimeError, TypeError) as exc:
            print(f"memory {name}: {str(exc).splitlines()[0]}")
            continue
        sink.write("memory", {"op": name, "rows": rows, "cols": cols, "bytes": nbytes,
                              "seconds": f"{seconds:.4e}", "gbps": f"{nbytes / seconds / 1e9:.0f}"})
    vocab = 512 if quick else 128256
    tokens = 64 if quick else 8192
    logits = torch.randn(tokens, vocab, device=device, dtype=torch.float32)
    target = torch.randint(0, vocab, (tokens,), device=device)
    nbytes = 8 * tokens * vocab  # log-softmax reads and writes FP32 logits; the gather is negligible
    seconds = timer(lambda: F.cross_entropy(logits, target))
    sink.write("memory", {"op": "cross_entropy_fp32", "rows": tokens, "cols": vocab, "bytes": nbytes,
                          "seconds": f"{seconds:.4e}", "gbps": f"{nbytes / seconds / 1e9:.0f}"})


def measure_attention(sink: Sink, timer: Timer, device: str, quick: bool):
    """Fused causal attention forward and backward through each SDPA backend (cuDNN, FlashAttention-2, ...)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash2": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    if device != "cuda":
        backends = {"math": SDPBackend.MATH}
    cases = [(8, 128), (2, 64)] if quick else [(h, s) for h in (8, 32) for s in (1024, 2048, 4096, 8192, 16384, 32768)]
    for backend, which in backends.items():
        for heads, seq in cases:
            for causal in ((True,) if seq != 4096 else (True, False)):
                batch = max(16384 // seq, 1) if not quick else 1
                try:
                    with sdpa_kernel(which):
                        fwd, bwd = _attention_seconds(timer, device, batch, heads, seq, causal)
                except RuntimeError as exc:
                    print(f"attention {backend} h{heads} s{seq}: {str(exc).splitlines()[0]}")
                    continue
                flops = 4 * batch * heads * seq * seq * 128 * (0.5 if causal else 1.0)
                sink.write("attention", {"backend": backend, "batch": batch, "heads": heads, "seq": seq,
                                         "head_dim": 128, "causal": int(causal), "fwd_seconds": f"{fwd:.4e}",
                                         "bwd_seconds": f"{bwd:.4e}", "fwd_tflops": f"{flops / fwd / 1e12:.1f}",
                                         "bwd_tflops": f"{2.5 * flops / bwd / 1e12:.1f}", **timer.clock})


def _attention_seconds(timer: Timer, device: str, batch: int, heads: int, seq: int, causal: bool):
    """Forward and backward seconds of one head-dim-128 BF16 attention under the active SDPA backend."""
    q, k, v = (torch.randn(batch, heads, seq, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad = torch.randn_like(out)
    fwd = timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    bwd = timer(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
    return fwd, bwd


def nvml_reading():
    """SM clock (MHz), power (W) and temperature (C) now, or {} where NVML is unavailable."""
    try:
        import pynvml
        if not getattr(nvml_reading, "ready", False):
            pynvml.nvmlInit()
            nvml_reading.ready = True
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                "temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)}
    except Exception:  # noqa: BLE001 - NVML is optional; the timings stand without it
        return {}


def measure_sustained(sink: Sink, timer: Timer, device: str, seconds: float):
    """An 8192^3 BF16 GEMM run back to back for a while: the rate and clock a GPU holds under load."""
    size = 8192 if device == "cuda" else 256
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = timer._batch(lambda: a @ b, 150 if device == "cuda" else 5)
        sink.write("sustained", {"elapsed_s": f"{time.perf_counter() - start:.2f}",
                                 "tflops": f"{2 * size ** 3 / t / 1e12:.1f}", **nvml_reading()})


def measure_contention(sink: Sink, timer: Timer, device: str, seconds: float):
    """A GEMM alone, then beside a copy streaming through HBM on another stream (as NCCL's kernels run beside
    compute): how much longer compute takes while communication moves data."""
    if device != "cuda":
        return
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    src = torch.randn(2 ** 30, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    side = torch.cuda.Stream()
    for beside in (False, True, False, True):  # alternate, so heat and clock drift hit both alike
        began = time.perf_counter()
        while time.perf_counter() - began < seconds / 4:
            with torch.cuda.stream(side):
                for _ in range(60 if beside else 0):  # ~60 ms of copies: longer than the 20 GEMMs below
                    dst.copy_(src)
            t = timer._batch(lambda: a @ a, 20)
            torch.cuda.synchronize()
            rate = 2 * 8192 ** 3 / t / 1e12
            sink.write("contention", {"copy_beside": int(beside), "gemm_tflops": f"{rate:.1f}", **nvml_reading()})


def device_info(device: str) -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d")}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info |= {"name": props.name, "sm_count": props.multi_processor_count,
                 "l2_bytes": getattr(props, "L2_cache_size", None), "memory_bytes": props.total_memory}
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            info |= {"driver": pynvml.nvmlSystemGetDriverVersion(),
                     "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
                     "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000}
        except Exception:  # noqa: BLE001 - optional
            pass
    return info | {"idle": nvml_reading()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, e.g. on a CPU)")
    parser.add_argument("--sustained-seconds", type=float, default=10.0)
    parser.add_argument("--heat-seconds", type=float, default=0.03, help="load before each measurement")
    parser.add_argument("--steps", default="sustained,gemm,grouped,memory,attention",
                        help="comma-separated steps (also: contention)")
    args = parser.parse_args()
    sink, timer = Sink(args.out), Timer(args.device, 0.002 if args.quick else 0.02, args.heat_seconds)
    info = device_info(args.device)
    (args.out / "device.json").write_text(json.dumps(info, indent=1))
    fp8_ok = args.device == "cuda" and torch.cuda.get_device_capability() >= (8, 9)
    steps = [("sustained", lambda: measure_sustained(sink, timer, args.device, args.sustained_seconds)),
             ("gemm", lambda: measure_gemms(sink, timer, args.device, args.quick, fp8_ok)),
             ("grouped", lambda: measure_grouped(sink, timer, args.device, args.quick)),
             ("memory", lambda: measure_memory(sink, timer, args.device, args.quick)),
             ("attention", lambda: measure_attention(sink, timer, args.device, args.quick)),
             ("contention", lambda: measure_contention(sink, timer, args.device, args.sustained_seconds))]
    for name, step in steps:
        if name not in args.steps.split(","):
            continue
        began = time.perf_counter()
        step()
        print(f"{name}: {time.perf_counter() - began:.1f} s", flush=True)
    info["after"] = nvml_reading()
    (args.out / "device.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
