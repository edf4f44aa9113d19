"""Search: spaces (YAML), candidates, the Optuna loop, executors, storage, and the study's files.

Owns what to search (space), how (census, samplers, refinement, the ask/tell
loop, in-process or Ray executors), where results live (journal or RDB, the
result cache) and what a study leaves behind (trials.csv, best.json, plots).
Imports ``sim``, ``hardware``, ``workload``, ``parallel`` and ``model``.
"""
