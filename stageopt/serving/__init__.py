"""Serving: inference plans and hardware from the same graph as training.

Owns the inference workload (prefill and decode steps of a batch of requests
over a paged KV cache, derived from the shared block templates), serving plans
(TP, PP, EP, data-parallel attention, batch caps, chunked prefill,
disaggregated prefill and decode pools), the analytical steady-state model and
the discrete-event simulation of request arrivals, per-rank Chakra traces of a
prefill and a decode step, and the serving search. Imports the model, graph,
parallel, hardware, chakra, astrasim and program floors; nothing above them.
"""
