"""Layouts: how a tensor is placed on each parallel axis.

On every axis a tensor is either replicated, split along one dimension, or a
partial sum (each rank holds an addend). Converting one placement into another
is what a collective does; :func:`conversion` names the collective.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Split:
    dim: int

    def __repr__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class _Mark:
    name: str

    def __repr__(self) -> str:
        return self.name


REPLICATE = _Mark("R")
PARTIAL = _Mark("P")
Placement = Split | _Mark


@dataclass(frozen=True, slots=True)
class Layout:
    """Placements by axis name; axes not listed are replicated."""

    items: tuple[tuple[str, Placement], ...] = ()

    @staticmethod
    def of(**placements: Placement) -> "Layout":
        return Layout(tuple(sorted((a, p) for a, p in placements.items() if p != REPLICATE)))

    def get(self, axis: str) -> Placement:
        for name, placement in self.items:
            if name == axis:
                return placement
        return REPLICATE

    def with_(self, axis: str, placement: Placement) -> "Layout":
        rest = {a: p for a, p in self.items if a != axis}
        rest[axis] = placement
        return Layout.of(**rest)

    def axes(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.items)

    def split_axes(self, dim: int) -> tuple[str, ...]:
        return tuple(a for a, p in self.items if p == Split(dim))

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{a}:{p!r}" for a, p in self.items) + "}"


def conversion(src: Placement, dst: Placement) -> str | None:
    """The collective that turns ``src`` into ``dst`` (None when it is free).

    Replicate -> Split is a local slice; Replicate or Split -> Partial is free
    too (a zero-padded addend), which is how gradients of slices are formed.
    """
    if src == dst:
        return None
    if src == PARTIAL:
        return "all_reduce" if dst == REPLICATE else "reduce_scatter"
    if isinstance(src, Split):
        if dst == REPLICATE:
            return "all_gather"
        if isinstance(dst, Split):
            return "all_to_all"
        return None  # Split -> Partial: zero-padded addend
    return None  # Replicate -> Split (slice) or -> Partial


def backward_target(src: Placement) -> Placement:
    """Placement a gradient must reach to flow back through a conversion from ``src``."""
    if src == REPLICATE:
        return PARTIAL
    if src == PARTIAL:
        return REPLICATE
    return src
