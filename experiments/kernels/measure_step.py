"""Time a whole forward and backward pass of a Llama model on one GPU, as eager torchtitan runs it.

Why: the kernels measured alone (measure_kernels.py) fit the kernel model within a few
percent, yet the shares fitted to published training runs sit 12-19% below them.
This measures one step of a real model on one GPU (no communication at all), and
splits its GPU time by kernel family with PyTorch's profiler, so the
step can be set against the sum of stageopt's kernels (compare_step.py) and the
gap placed: inside one GPU's sequence of kernels, or in what many GPUs add.

The model follows torchtitan's Llama: separate q/k/v projections, rotary embedding
through complex multiplication in FP32, K/V repeated for grouped-query attention,
SDPA (causal), SwiGLU, torch.nn.RMSNorm, the loss on FP32 logits. BF16 weights,
no optimizer step.

    python experiments/kernels/measure_step.py --out experiments/kernels/h100
    python experiments/kernels/measure_step.py --out /tmp/s --device cpu --quick
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import pathlib
import re
import threading
import time

import torch
import torch.nn.functional as F
from torch import nn

# name: (layers, hidden, ffn, heads, kv heads, vocab, seq)
CONFIGS = {"llama3-8b-4l": (4, 4096, 14336, 32, 8, 128256, 8192),
           "llama3-70b-2l": (2, 8192, 28672, 64, 8, 128256, 4096)}
QUICK = {"tiny": (2, 256, 512, 4, 2, 1000, 128)}
FAMILIES = (("attention", re.compile(r"sdpa|fmha|flash|attention|compute_dot_do_o", re.I)),  # before gemm: cuDNN's
            ("gemm", re.compile(r"gemm|nvjet|sm90_xmma|cutlass|wgmma", re.I)))  # attention kernels use wgmma too


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.wq = nn.Linear(hidden, heads * self.dim, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.wo = nn.Linear(heads * self.dim, hidden, bias=False)

    def forward(self, x, freqs):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.dim)
        k = self.wk(x).view(b, s, self.kv_heads, self.dim)
        v = self.wv(x).view(b, s, self.kv_heads, self.dim)
        q, k = rotary(q, freqs), rotary(k, freqs)
        repeat = self.heads // self.kv_heads
        k, v = (t.repeat_interleave(repeat, dim=2) for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


def rotary(x, freqs):
    """torchtitan's apply_rotary_emb: pairs as complex numbers in FP32, times the unit rotations."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs[None, :, None, :]).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self, hidden: int, ffn: int, heads: int, kv_heads: int):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.attention = Attention(hidden, heads, kv_heads)
        self.w1, self.w3 = nn.Linear(hidden, ffn, bias=False), nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, freqs):
        h = x + self.attention(self.attention_norm(x), freqs)
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Llama(nn.Module):
    def __init__(self, layers, hidden, ffn, heads, kv_heads, vocab, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, ffn, heads, kv_heads) for _ in range(layers))
        self.norm, self.output = nn.RMSNorm(hidden), nn.Linear(hidden, vocab, bias=False)
        self.dim, self.seq = hidden // heads, seq

    def rotations(self, device) -> torch.Tensor:
        """Unit complex rotations per position and frequency (complex64; Llama 3's base 500,000)."""
        angles = torch.outer(torch.arange(self.seq, device=device),
                             1.0 / 500000 ** (torch.arange(0, self.dim, 2, device=device) / self.dim))
        return torch.polar(torch.ones_like(angles), angles)

    def forward(self, tokens, targets, freqs):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, freqs)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class ClockSampler:
    """The SM clock read every 5 ms from another thread while the steps run (NVML; none on a CPU): the clock
    a mixed step holds, to set against the clock the kernels measured alone held."""

    def __init__(self, device: str):
        self.readings: list[int] = []
        self.handle = None
        if device == "cuda":
            try:
                import pynvml
                pynvml.nvmlInit()
                self.handle, self.read = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetClockInfo
                self.sm = pynvml.NVML_CLOCK_SM
            except Exception:  # noqa: BLE001 - optional: the timings stand without it
                self.handle = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while self.handle is not None and not self.stop.wait(0.005):
            self.readings.append(self.read(self.handle, self.sm))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def median(self) -> str:
        return f"{sorted(self.readings)[len(self.readings) // 2]}" if self.readings else ""


def family(name: str) -> str:
    for label, pattern in FAMILIES:
        if pattern.search(name):
            return label
    return "other"


def measure(name: str, dims, device: str, steps: int, out: pathlib.Path) -> dict:
    """Wall seconds of forward + backward, and GPU seconds by kernel family from the profiler."""
    torch.manual_seed(0)
    model = Llama(*dims).to(device=device, dtype=torch.bfloat16)
    freqs = model.rotations(device)
    seq, vocab = dims[6], dims[5]
    tokens = torch.randint(0, vocab, (1, seq), device=device)

    def step():
        model.zero_grad(set_to_none=True)
        model(tokens, tokens, freqs).backward()
    for _ in range(3):
        step()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    with ClockSampler(device) as clocks:
        began = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        wall = (time.perf_counter() - began) / steps
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda"
                                                           else [])
    with torch.profiler.profile(activities=activities) as prof:
        step()
        sync()
    sums = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    kernels = 0
    table = []
    for event in prof.key_averages():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue  # CPU ops also report the device time of the kernels they launched: count kernels once
        sums[family(event.key)] += event.self_device_time_total * 1e-6
        kernels += event.count
        table.append((event.self_device_time_total, event.count, family(event.key), event.key[:120]))
    with open(out / f"kernels_{name}.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["gpu_us", "count", "family", "kernel"])
        writer.writerows(sorted(table, reverse=True))
    return {"config": name, "layers": dims[0], "hidden": dims[1], "ffn": dims[2], "heads": dims[3],
            "kv_heads": dims[4], "vocab": vocab, "seq": seq, "wall_s": f"{wall:.5f}",
            "gpu_s": f"{sum(sums.values()):.5f}", **{f"{k}_s": f"{v:.5f}" for k, v in sums.items()},
            "kernels": kernels, "sm_mhz_median": clocks.median()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sdpa", choices=("default", "flash"), default="default",
                        help="PyTorch's own backend order, or FlashAttention-2 only (torchtitan before 2025-10)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if args.sdpa == "flash" else contextlib.nullcontext()
    with chosen if args.device == "cuda" else contextlib.nullcontext():
        rows = [measure(name, dims, args.device, args.steps, args.out)
                for name, dims in (QUICK if args.quick else CONFIGS).items()]
    with open(args.out / "step.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
