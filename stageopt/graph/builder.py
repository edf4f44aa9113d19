"""GraphBuilder: records ops and inserts the collectives layouts require.

Module templates (:mod:`stageopt.graph.templates`) call :meth:`einsum`,
:meth:`vector` and :meth:`view`; each converts its inputs to the layouts it
needs with :meth:`convert` (the layout matcher), which emits the collective
for every axis whose placement changes.
"""

from __future__ import annotations

import sympy as sp

from stageopt.graph.einsum import gemm_dims, letter_sizes, local_product, parse_spec, required_layouts
from stageopt.graph.layout import PARTIAL, REPLICATE, Layout, Split, conversion
from stageopt.graph.symbols import AXES
from stageopt.graph.tensor import Collective, Op, Tensor


class GraphBuilder:
    """Collects ops of one phase; remembers which op produced each tensor."""

    def __init__(self, phase: str = "fwd", lowp_gather: float = 0.0) -> None:
        """``lowp_gather``: bytes an element of a low-precision GEMM's input moves when gathered over TP
        (the stack quantizes before the gather; 0 in high precision)."""
        self.lowp_gather = lowp_gather
        self.ops: list[Op] = []
        self.phase = phase
        self.region = ""
        self.producer: dict[int, Op] = {}
        self._converted: dict[tuple[int, Layout], Tensor] = {}

    # -- recording -------------------------------------------------------
    def emit(self, op: Op) -> Op:
        op.phase = self.phase
        op.region = op.region or self.region
        self.ops.append(op)
        for t in op.outputs:
            self.producer[t.uid] = op
        return op

    def derive(self, t: Tensor, name: str | None = None, **changes: object) -> Tensor:
        fields = dict(name=name or t.name, shape=t.shape, layout=t.layout, dtype_bytes=t.dtype_bytes,
                      role=t.role, param_group=t.param_group, counted=t.counted)
        fields.update(changes)
        return Tensor(**fields)

    # -- the layout matcher --------------------------------------------------
    def convert(self, t: Tensor, target: Layout) -> Tensor:
        """Return ``t`` in layout ``target``, emitting one collective per changed axis."""
        if t.layout == target:
            return t
        key = (t.uid, target)
        if key in self._converted:
            return self._converted[key]
        current = t
        for axis in AXES:
            src, dst = current.layout.get(axis), target.get(axis)
            if src == dst:
                continue
            new = self.derive(current, f"{t.name}", layout=current.layout.with_(axis, dst))
            kind = conversion(src, dst)
            collective = Collective(kind, axis, current.local_bytes(), new.local_bytes()) if kind else None
            self.emit(Op(name=f"{kind or 'reshard'}:{t.name}:{axis}", kind="comm" if kind else "view",
                         inputs=(current,), outputs=(new,), collective=collective,
                         attrs={"axis": axis, "src": src, "dst": dst}))
            current = new
        self._converted[key] = current
        return current

    # -- op constructors -------------------------------------------------------
    def einsum(self, name: str, spec: str, operands: tuple[Tensor, ...], *, out_dtype: int | None = None,
               kind: str = "matmul", flops_scale: sp.Expr = sp.Integer(1), role: str = "activation",
               extra: dict | None = None, precision: int | None = None) -> Tensor:
        """A matmul or attention op; ``precision`` is the kernel model's class (0: stays in high
        precision, 1: FP8-capable with an activation cast, 2: FP8-capable, operands cast already);
        by default 1 when a weight is an operand (a linear layer), else 0."""
        ins, out = parse_spec(spec)
        weights_first = tuple(sorted(range(len(operands)), key=lambda i: operands[i].role != "weight"))
        req, out_layout, split = required_layouts(ins, out, operands, weights_first)
        inputs = tuple(self.convert(x, layout) for x, layout in zip(operands, req))
        sizes = letter_sizes(ins, inputs)
        y = Tensor(name=name, shape=tuple(sizes[c] for c in out), layout=out_layout,
                   dtype_bytes=out_dtype or inputs[0].dtype_bytes, role=role)
        flops = 2 * local_product(sizes, split) * flops_scale
        if precision is None:
            precision = 1 if any(x.role == "weight" for x in operands) else 0
        attrs = {"spec": spec, "precision": precision if kind == "matmul" else 0, **(extra or {})}
        if kind == "matmul" and len(ins) == 2:
            attrs["gemm"] = (*gemm_dims(ins, out, sizes, split), self.cast_elements(inputs, precision))
            if precision and self.lowp_gather:
                self._gather_low_precision(inputs)
        self.emit(Op(name=name, kind=kind, inputs=inputs, outputs=(y,), flops=flops, attrs=attrs))
        return y

    def cast_elements(self, inputs: tuple[Tensor, ...], precision: int) -> sp.Expr:
        """Elements of the activation operand a low-precision GEMM casts (0 unless ``precision`` is 1).

        An operand all-gathered over TP for the GEMM (a sequence-parallel input, or its gradient in
        backward) is cast on each rank's shard before the gather, which then moves FP8 (Transformer
        Engine and torchao quantize before their all-gather): 1/tp of the elements the GEMM reads.
        """
        if precision != 1:
            return sp.Integer(0)
        x = next((t for t in inputs if t.role != "weight"), inputs[0])
        src = self._tp_gather(x)
        return (src.inputs[0] if src is not None else x).local_numel()

    def _tp_gather(self, t: Tensor) -> Op | None:
        """The TP all-gather that produced ``t``, if one did."""
        src = self.producer.get(t.uid)
        gathered = (src is not None and src.kind == "comm" and src.attrs.get("axis") == "tp"
                    and src.collective is not None and src.collective.kind == "all_gather")
        return src if gathered else None

    def _gather_low_precision(self, inputs: tuple[Tensor, ...]) -> None:
        """A low-precision GEMM's activation operands gathered over TP move in low precision: the stack casts
        each rank's shard first (Transformer Engine's ``gather_along_first_dim`` with a quantizer; torchao's
        Float8 tensor parallelism), the forward inputs, the gradients gathered for data gradients and the
        inputs re-gathered for weight gradients alike."""
        for x in inputs:
            src = self._tp_gather(x) if x.role != "weight" else None
            if src is not None and not src.attrs.get("low_precision"):
                c, scale = src.collective, self.lowp_gather / x.dtype_bytes
                src.collective = Collective(c.kind, c.axis, c.input_bytes * scale, c.output_bytes * scale)
                src.attrs["low_precision"] = True

    def vector(self, name: str, inputs: tuple[Tensor, ...], *, flops_per_elem: float = 1,
               bwd_flops_per_elem: float = 2, needs: tuple[str, ...] = (), out_dtype: int | None = None,
               outputs: tuple[tuple[str, int, str], ...] | None = None, linear: bool = False,
               bwd: str = "generic", layout: Layout | None = None, fuse: str = "",
               eager_passes: float = 1.0, bwd_eager_passes: float | None = None,
               kernels: tuple[int, int] | None = None, bwd_kernels: tuple[int, int] | None = None,
               random: bool = False) -> tuple[Tensor, ...]:
        """An elementwise-style op over the first input's shape.

        ``needs`` names what backward reads: "in0", "in1", ... or "out0", ...
        ``outputs`` lists (name, dtype_bytes, role) when there is more than one.
        Non-linear ops need every input free of partial sums. ``fuse`` names the
        fusion group (:mod:`stageopt.graph.fusion`) a stack may merge the op into;
        ``eager_passes`` how many kernels (each streaming the op's tensors) eager
        PyTorch launches for it when no stack fusion covers it; ``bwd_eager_passes``
        the same for its gradient where autograd's differs (default: the same).
        ``kernels`` / ``bwd_kernels``: (fixed, per local expert) kernel counts of an op (its gradient)
        that loops over the rank's experts (:attr:`~stageopt.graph.tensor.Op.launch_count`).
        ``random``: the forward draws a random number per element (dropout); its gradient does not.
        """
        main = inputs[0]
        target = layout or main.layout
        if not linear:
            target = Layout.of(**{a: (REPLICATE if p == PARTIAL else p) for a, p in target.items})
        converted = tuple(self.convert(x, target) if x.role != "weight" and x.shape == main.shape else x
                          for x in inputs)
        specs = outputs or ((name, out_dtype or main.dtype_bytes, "activation"),)
        outs = tuple(Tensor(name=n, shape=main.shape, layout=converted[0].layout, dtype_bytes=b, role=r)
                     for n, b, r in specs)
        numel = converted[0].local_numel()
        self.emit(Op(name=name, kind="vector", inputs=converted, outputs=outs,
                     vector_flops=numel * flops_per_elem,
                     attrs={"needs": needs, "bwd": bwd, "bwd_flops": bwd_flops_per_elem, "fuse": fuse,
                            "eager_passes": eager_passes,
                            "bwd_eager_passes": eager_passes if bwd_eager_passes is None else bwd_eager_passes,
                            **({"kernels": kernels} if kernels else {}),
                            **({"random": True} if random else {}),
                            **({"bwd_kernels": bwd_kernels} if bwd_kernels else {})}))
        return outs

    def view(self, name: str, t: Tensor, shape: tuple[sp.Expr, ...], dim_map: dict[int, int]) -> Tensor:
        """Reshape without moving data; ``dim_map`` maps split dims old -> new."""
        layout = Layout.of(**{a: (Split(dim_map[p.dim]) if isinstance(p, Split) else p) for a, p in t.layout.items})
        y = self.derive(t, name, shape=shape, layout=layout)
        self.emit(Op(name=name, kind="view", inputs=(t,), outputs=(y,), attrs={"dim_map": dim_map}))
        return y
