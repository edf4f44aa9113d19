"""The symbolic tensor graph: sympy-shaped tensors, layouts, block templates, derived backward.

Owns one layer's forward ops with their per-axis layouts (templates), the
layout matcher that inserts collectives, backward from per-op rules, the
recompute policy, and the compilation of block costs to numpy functions.
Imports ``model`` (for specs) and ``errors``; knows nothing of stages or hardware.
"""
