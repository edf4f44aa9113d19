"""Derive the backward pass of a block from per-op rules.

Walks the forward ops in reverse, asking each op's rule for the gradients of
its inputs. Collectives in backward come from the same layout matcher: the
gradient of a conversion is converted back (all-gather <-> reduce-scatter,
all-reduce <-> identity, all-to-all <-> all-to-all). A forward tensor that
backward reads is *saved*; when it was produced by an all-gather, the shard is
saved instead and the all-gather is re-run in backward (as Megatron does for
sequence parallelism), so activation memory stays sharded. A stack that keeps
the gathered tensor of a tensor-parallel all-gather (DTensor's redistribution,
torchtitan) saves it whole and gathers nothing in backward (``tp_regather``). Each saved tensor
records who reads it: an FP8-capable weight-gradient GEMM (which, in FP8
training, keeps only the FP8 copy of its input) or anything else (which needs
the high-precision tensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stageopt.graph.builder import GraphBuilder
from stageopt.graph.einsum import parse_spec, required_layouts
from stageopt.graph.layout import PARTIAL, REPLICATE, Layout, Split, backward_target
from stageopt.graph.tensor import Op, Tensor, backward_score_shape


@dataclass
class Backward:
    """Result of differentiating one block."""

    ops: list[Op]
    input_grad: Tensor | None
    weight_grads: dict[int, Tensor]
    saved: dict[int, Tensor] = field(default_factory=dict)
    regathers: list[Op] = field(default_factory=list)
    fp8_reads: frozenset[int] = frozenset()  # saved uids an FP8-capable weight-gradient GEMM reads
    high_reads: frozenset[int] = frozenset()  # saved uids some other backward op reads


class _Differentiator:
    def __init__(self, fwd: GraphBuilder, tp_regather: bool = True) -> None:
        self.fwd = fwd
        self.tp_regather = tp_regather
        self.bwd = GraphBuilder(phase="bwd", lowp_gather=fwd.lowp_gather)
        self.grads: dict[int, list[Tensor]] = {}
        self.saved: dict[int, Tensor] = {}
        self.regathers: list[Op] = []
        self.weight_grads: dict[int, Tensor] = {}
        self.fp8_reads: set[int] = set()
        self.high_reads: set[int] = set()

    def fetch(self, t: Tensor, fp8_wgrad: bool = False) -> Tensor:
        """A forward tensor read by backward: saved, or re-gathered from its saved shard.

        ``fp8_wgrad``: the reader is an FP8-capable weight-gradient GEMM.
        """
        op = self.fwd.producer.get(t.uid)
        if (op is not None and op.kind == "comm" and op.collective.kind == "all_gather"
                and (self.tp_regather or op.collective.axis != "tp")):
            source = self.fetch(op.inputs[0], fp8_wgrad)
            before = len(self.bwd.ops)
            gathered = self.bwd.convert(source, t.layout)
            for new in self.bwd.ops[before:]:
                new.attrs["regather_of"] = t.uid
                self.regathers.append(new)
            return gathered
        if t.role != "weight":
            self.saved[t.uid] = t
            (self.fp8_reads if fp8_wgrad else self.high_reads).add(t.uid)
        return t

    def add_grad(self, t: Tensor, g: Tensor) -> None:
        if t.role == "input":
            return
        self.grads.setdefault(t.uid, []).append(g)

    def grad_of(self, t: Tensor) -> Tensor | None:
        parts = self.grads.pop(t.uid, None)
        if not parts:
            return None
        total = parts[0]
        for other in parts[1:]:
            other = self.bwd.convert(other, total.layout)
            (total,) = self.bwd.vector(f"d{t.name}+", (total, other), flops_per_elem=1, linear=True)
        return total

    # -- rules ---------------------------------------------------------------
    def run(self, op: Op) -> None:
        gouts = [self.grad_of(t) for t in op.outputs]
        if all(g is None for g in gouts):
            return
        if op.kind == "matmul":
            self._einsum(op, gouts[0])
        elif op.kind == "attention":
            self._attention(op, gouts[0])
        elif op.kind == "comm" or (op.kind == "view" and "axis" in op.attrs):
            axis = op.attrs["axis"]
            g = gouts[0]
            self.add_grad(op.inputs[0], self.bwd.convert(g, g.layout.with_(axis, backward_target(op.attrs["src"]))))
        elif op.kind == "view":
            inverse = {new: old for old, new in op.attrs["dim_map"].items()}
            self.add_grad(op.inputs[0], self.bwd.view(f"d{op.inputs[0].name}", gouts[0], op.inputs[0].shape, inverse))
        else:
            self._vector(op, gouts)

    def _einsum(self, op: Op, gout: Tensor) -> None:
        ins, out = parse_spec(op.attrs["spec"])
        for i, x in enumerate(op.inputs):
            if x.role == "input":
                continue
            precision = 0 if op.attrs.get("precision", 0) == 0 else (2 if x.role == "weight" else 1)
            others = [self.fetch(y, fp8_wgrad=precision == 2) for j, y in enumerate(op.inputs) if j != i]
            spec = ",".join([out] + [ins[j] for j in range(len(ins)) if j != i]) + "->" + ins[i]
            tag = op.attrs.get("gemm_group")
            extra = {"gemm_group": f"{tag}/{'wgrad' if x.role == 'weight' else 'dgrad'}"} if tag else {}
            if "kernels" in op.attrs:  # a GEMM run one kernel per expert runs its gradients' GEMMs alike
                extra["kernels"] = op.attrs["kernels"]
            g = self.bwd.einsum(f"d{x.name}", spec, (gout, *others), out_dtype=x.dtype_bytes,
                                role="wgrad" if x.role == "weight" else "grad", precision=precision, extra=extra)
            self._deliver(x, g)

    def _attention(self, op: Op, gout: Tensor) -> None:
        q, k, v = op.inputs
        saved = [self.fetch(t) for t in (q, k, v, op.outputs[0])] + [self.fetch(t) for t in op.outputs[1:]]
        gout = self.bwd.convert(gout, complete(op.outputs[0].layout))
        _, kv_layout, _ = required_layouts(["bsgrd", "bsgrd"], "btgd", (gout, saved[0]), (0, 1))
        grads = tuple(self.bwd.derive(t, f"d{t.name}", layout=lay, role="grad")
                      for t, lay in ((q, q.layout), (k, kv_layout), (v, kv_layout)))
        self.bwd.emit(Op(name=f"d{op.name}", kind="attention", inputs=(gout, *saved), outputs=grads,
                         flops=2 * op.flops,
                         attrs={"spec": op.attrs.get("spec", ""), "causal": op.attrs.get("causal", False),
                                "gemm": backward_score_shape(op)}))
        for t, g in zip((q, k, v), grads):
            self._deliver(t, g)

    def _vector(self, op: Op, gouts: list[Tensor | None]) -> None:
        rule = op.attrs.get("bwd", "generic")
        g = gouts[0]
        if rule == "identity":
            for x in op.inputs:
                self.add_grad(x, g)
            return
        needed = tuple(self.fetch(op.inputs[int(need[2:])] if need.startswith("in") else op.outputs[int(need[3:])])
                       for need in op.attrs.get("needs", ()))
        g = self.bwd.convert(g, complete(op.outputs[0].layout))
        main = next(x for x in op.inputs if x.role != "weight")
        numel = g.local_numel()
        grads = []
        for x in op.inputs:
            if x.role in ("input", "mask"):
                continue
            if x.role == "weight":
                layout = x.layout
                for axis, placement in main.layout.items:
                    if isinstance(placement, Split) and x.layout.get(axis) == REPLICATE:
                        layout = layout.with_(axis, PARTIAL)
                grads.append(self.bwd.derive(x, f"d{x.name}", layout=layout, role="wgrad"))
            elif op.attrs.get("broadcast_partial") and x.shape != main.shape:
                # an input broadcast over a dimension the main input splits: its gradient sums over that split
                layout = complete(x.layout)
                for axis, placement in main.layout.items:
                    if isinstance(placement, Split) and x.layout.get(axis) == REPLICATE:
                        layout = layout.with_(axis, PARTIAL)
                grads.append(self.bwd.derive(x, f"d{x.name}", layout=layout, role="grad"))
            else:
                grads.append(self.bwd.derive(x, f"d{x.name}", layout=complete(x.layout), role="grad"))
        self.bwd.emit(Op(name=f"d{op.name}", kind="vector", inputs=(g, *needed), outputs=tuple(grads),
                         vector_flops=numel * op.attrs.get("bwd_flops", 2),
                         attrs={"fuse": op.attrs.get("fuse", ""),
                                "eager_passes": op.attrs.get("bwd_eager_passes", op.attrs.get("eager_passes", 1.0)),
                                **({"kernels": op.attrs["bwd_kernels"]} if "bwd_kernels" in op.attrs else {})}))
        targets = [x for x in op.inputs if x.role not in ("input", "mask")]
        for x, gx in zip(targets, grads):
            self._deliver(x, gx)

    def _deliver(self, x: Tensor, g: Tensor) -> None:
        if x.role == "weight":
            prior = self.weight_grads.get(x.uid)
            if prior is None:
                self.weight_grads[x.uid] = g
            else:
                (self.weight_grads[x.uid],) = self.bwd.vector(f"d{x.name}+", (prior, g), linear=True)
        else:
            self.add_grad(x, g)


def differentiate(fwd: GraphBuilder, output: Tensor, output_grad: Tensor | None,
                  block_input: Tensor | None, tp_regather: bool = True) -> Backward:
    """Backward ops for the forward ops in ``fwd``; ``output_grad`` seeds it (None for a loss).

    ``tp_regather``: a tensor-parallel all-gather's output is saved as its shard and re-gathered in
    backward (Megatron); otherwise saved whole.
    """
    d = _Differentiator(fwd, tp_regather)
    if output_grad is not None:
        d.add_grad(output, output_grad)
    else:
        d.add_grad(output, d.bwd.derive(output, f"d{output.name}", role="grad"))
    for op in reversed(fwd.ops):
        d.run(op)
    input_grad = None
    if block_input is not None:
        input_grad = d.grad_of(block_input)
        if input_grad is not None:
            input_grad = d.bwd.convert(input_grad, block_input.layout)
    return Backward(ops=d.bwd.ops, input_grad=input_grad, weight_grads=d.weight_grads,
                    saved=d.saved, regathers=d.regathers, fp8_reads=frozenset(d.fp8_reads),
                    high_reads=frozenset(d.high_reads))


def complete(layout: Layout) -> Layout:
    """The layout of a fully reduced gradient: partial sums become replicated."""
    return Layout.of(**{a: (REPLICATE if p == PARTIAL else p) for a, p in layout.items})
