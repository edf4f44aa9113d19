"""Parallel plans: the :class:`Plan` type, its feasibility rules, rank layout and pipeline schedules.

Owns how GPUs are split (tp, cp, ep, dp, pp, interleaving), which rank talks to
which (communicator groups, point-to-point peers) and the order of work on each
pipeline stage. Imports ``model`` and ``errors``.
"""
