"""Everything shaped like ASTRA-sim: its config files, its binary, and its timing semantics.

Owns the typed readers and the writers of system/network/memory configs, the
runner of the external binary (process group, timeout, strict parsing), and an
event replay that reproduces its congestion-unaware timing cycle for cycle.
Imports ``hardware``, ``chakra`` and ``errors``; the simulator backend that
uses it lives in ``stageopt.sim.astrasim_backend``.
"""
