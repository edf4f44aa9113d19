"""Our simulators behind one interface: ``Simulator.evaluate(workload, hardware) -> Estimate``.

Owns the analytical model (closed form, vectorized over plans), the symmetric
event replay of stage programs, and the backend that runs the real ASTRA-sim
binary. Imports ``workload``, ``program``, ``hardware`` and ``astrasim``; the
search and the commands sit above it.
"""
