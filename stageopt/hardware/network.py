"""Collective and point-to-point times over the hardware's network tiers (vectorized).

A communicator group whose consecutive members are ``stride`` ranks apart
keeps ``n_in = min(n, node_gpus // stride)`` members inside one NVLink domain
(ranks are laid out TP innermost, so small strides stay inside a node).

Every tier moves data at its *achieved* bus bandwidth (link bandwidth times the
efficiency nccl-tests measures for large messages). A group inside one domain
runs the domain's algorithm. A group spanning domains runs the way NCCL's rings
do: one ring through all members, several channels in parallel, each leaving a
domain through its own NIC (rail-optimized), so the ring's bandwidth is the
smaller of the NVLink bandwidth and the domain's ``n_in`` NICs together.

Where the hardware has an ``nccl`` field (the NVIDIA presets), a ring's
latency and bandwidth are those of the protocol NCCL picks for the message
(:mod:`stageopt.hardware.nccl_protocols`): NVLink and network hops at their
own per-protocol latencies, LL and LL128 at their share of the bandwidth; an
all-reduce across nodes takes NCCL's tree instead where that is cheaper
(:mod:`stageopt.hardware.nccl_tree`). Without it every step of a ring costs the tier's ``latency_us`` (a spanning
ring's, the scale-out tier's), the one α-β ring per tier ASTRA-sim also uses.
All-to-all sends the share of each rank's buffer bound for other domains over
the scale-out tier.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.special import gammaln

from stageopt.hardware.collectives import alpha_beta_terms
from stageopt.hardware.machine import Hardware, Tier
from stageopt.hardware.nccl_protocols import ring_protocol_time
from stageopt.hardware.nccl_tree import tree_all_reduce_time


def _tier_time(tier: Tier, kind: str, size, n):
    steps, factor = alpha_beta_terms(kind, tier.collectives.for_kind(kind), n)
    return steps * tier.latency_us * 1e-6 + factor * size / (tier.achieved_gbps * 1e9)


def ranks_inside_node(hw: Hardware, n, stride):
    n = np.asarray(n, dtype=float)
    per_node = np.maximum(np.floor(hw.node.gpus / np.asarray(stride, dtype=float)), 1.0)
    return np.minimum(n, per_node)


def remote_nodes_hit(n_out, copies, groups: int = 0, group_topk: int = 0, experts: int = 0):
    """Expected other domains a token's ``copies`` routed experts fall in, experts spread evenly over
    ``n_out`` domains and chosen uniformly: ``(n_out - 1)(1 - (1 - 1/n_out)^copies)``.

    Group-limited routing (DeepSeek-V3's device-limited routing: experts in ``groups`` groups, each token
    choosing among the experts of ``group_topk`` groups): with whole groups per domain a token reaches the
    domains holding its chosen groups, ``n_out (1 - C(G - G/n_out, g) / C(G, g))`` of them; with each group
    over ``s`` domains its copies fall uniformly on the ``g s`` domains of its groups. With one group a token
    and groups that straddle domains otherwise (given the model's ``experts``), the domains its group overlaps,
    each hit unless all copies fall elsewhere in the group (:func:`_one_group_reach`). A share
    ``(n_out - 1)/n_out`` of the domains reached are other domains.
    """
    n_out = np.asarray(n_out, dtype=float)
    copies = np.asarray(copies, dtype=float)
    uniform = (n_out - 1) * (1 - (1 - 1 / np.maximum(n_out, 1)) ** copies)
    if not (groups and group_topk):
        return uniform
    safe = np.maximum(n_out, 1)
    per = groups / safe  # groups per domain
    whole = (per >= 1) & (np.mod(groups, safe) == 0)
    miss = np.exp(_log_choose(groups - per, group_topk) - _log_choose(groups, group_topk))
    reached = np.where(whole, n_out * (1 - np.where(groups - per >= group_topk, miss, 0.0)), 0.0)
    span = safe / groups  # domains per group
    spread = (span > 1) & (np.mod(safe, groups) == 0)
    pool = group_topk * span
    reached = np.where(spread, pool * (1 - (1 - 1 / pool) ** copies), reached)
    known = whole | spread
    if group_topk == 1 and experts:
        straddle = np.vectorize(lambda d, k: _one_group_reach(d, k, groups, experts) if d > 1 else 1.0)(safe, copies)
        reached, known = np.where(known, reached, straddle), np.ones_like(known, dtype=bool)
    return np.where(known, np.minimum(reached * (n_out - 1) / safe, uniform), uniform)


@functools.lru_cache(maxsize=4096)  # a search asks the same few layouts for every candidate
def _one_group_reach(domains: float, copies: float, groups: int, experts: int) -> float:
    """Expected domains a token reaches when its ``copies`` are drawn without replacement from one of ``groups``
    aligned blocks of consecutive experts, each domain holding ``experts / domains`` consecutive experts (the
    layout Megatron-Core and AutoModel give EP ranks), averaged over the blocks."""
    size, held_by = experts / groups, experts / domains
    total = 0.0
    for block in range(groups):
        low, high = block * size, (block + 1) * size
        for domain in range(int(low // held_by), int(np.ceil(high / held_by))):
            held = min(high, (domain + 1) * held_by) - max(low, domain * held_by)  # the block's experts there
            if held > 0:
                total += 1.0 - (float(np.exp(_log_choose(size - held, copies) - _log_choose(size, copies)))
                                if size - held >= copies else 0.0)
    return total / groups


def ranks_hit(n, copies, groups: int = 0, group_topk: int = 0, experts: int = 0):
    """Expected distinct ranks of an ``n``-rank EP group that a token's ``copies`` routed experts fall on
    (experts spread evenly, chosen as :func:`remote_nodes_hit` chooses them; one rank: 1).

    A node-deduplicated dispatch sends a token to each such rank once, whatever the number of its experts
    there: DeepEP's dispatch layout marks each (token, rank) pair once (``get_dispatch_layout``'s
    ``is_token_in_rank``), and HybridEP dispatches by rank and permutes into expert order on arrival
    (``dispatch_with_permute`` with ``num_of_experts_per_rank``); the combine returns one sum per pair.
    """
    n = np.asarray(n, dtype=float)
    safe = np.maximum(n, 2.0)
    return np.where(n > 1, remote_nodes_hit(safe, copies, groups, group_topk, experts) * safe / (safe - 1), 1.0)


def _log_choose(n, k):
    n = np.asarray(n, dtype=float)
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(np.maximum(n - k, 0) + 1)


def collective_time(hw: Hardware, kind: str, size, n, stride, copies=1, groups: tuple[int, int, int] = (0, 0, 0)):
    """Seconds for one collective; ``size`` is the whole buffer (AG output, RS input).

    ``copies`` > 1 marks an MoE all-to-all whose buffer holds that many routed copies of
    each token, dispatched node-deduplicated (DeepEP / HybridEP): each token crosses the
    scale-out tier once per other domain holding one of its experts
    (:func:`remote_nodes_hit`, with the model's routing ``groups`` limit), and the domain's
    own links once per rank holding one (:func:`ranks_hit`), not once per copy.
    """
    size = np.asarray(size, dtype=float)
    n = np.asarray(n, dtype=float)
    inner, outer = hw.tiers[0], hw.tiers[1]
    n_in = ranks_inside_node(hw, n, stride)
    n_out = np.maximum(np.ceil(n / n_in), 1.0)
    inside = _tier_time(inner, kind, size, n_in)
    if kind == "all_to_all":
        copies = np.asarray(copies, dtype=float)
        dedup = copies > 1
        per_token = size / np.maximum(copies, 1)
        sent = np.where(dedup, per_token * ranks_hit(n, copies, *groups), size)  # what the dispatch moves
        remote = remote_nodes_hit(n_out, copies, *groups)
        off_node = np.where(dedup, per_token * remote, (n - n_in) / n * size)
        inter = outer.latency_us * 1e-6 + off_node / (outer.achieved_gbps * 1e9)
        in_domain = _tier_time(inner, kind, np.where(dedup, sent, size * n_in / n), n_in)
        return np.where(n_out > 1, in_domain + inter, _tier_time(inner, kind, sent, n_in))
    steps, factor = alpha_beta_terms(kind, outer.collectives.for_kind(kind), n)
    ring_gbps = np.minimum(inner.achieved_gbps, n_in * outer.achieved_gbps)
    spanning = steps * outer.latency_us * 1e-6 + factor * size / (ring_gbps * 1e9)
    ring_in, ring_out = (t.collectives.for_kind(kind) == "ring" for t in (inner, outer))
    if hw.nccl is not None and (ring_in or ring_out):
        # NCCL's protocol choice, in one call: a group inside one domain is a ring over one node (n = n_in)
        bus = np.where(n_out > 1, ring_gbps, inner.achieved_gbps)
        nccl = ring_protocol_time(hw.nccl, kind, size, n, n_out, bus, per_node=n_in)
        if kind == "all_reduce" and ring_out:  # across nodes NCCL may run it as a tree instead
            nccl = np.where(n_out > 1, np.minimum(nccl, tree_all_reduce_time(hw.nccl, size, n_in, n_out, bus)), nccl)
        inside, spanning = (nccl if ring_in else inside), (nccl if ring_out else spanning)
    return np.where(n_out > 1, spanning, inside)


def exposed_under_gemm(comm, gemm, chunks):
    """Communication left exposed when pipelined chunk by chunk with the GEMMs it feeds or drains.

    The collective and its GEMMs are split into ``chunks`` (the TP size): the
    first GEMM chunk runs on local data while the next chunk moves, so all but
    one chunk of GEMM work can hide communication (Megatron-Core / Transformer
    Engine userbuffer overlap).
    """
    chunks = np.asarray(chunks, dtype=float)
    return np.maximum(np.asarray(comm) - (chunks - 1) / chunks * np.asarray(gemm), 0.0)


def exposed_beside_gemm(comm, gemm):
    """Communication left exposed when issued asynchronously beside one GEMM (no chunking): what the GEMM
    does not cover."""
    return np.maximum(np.asarray(comm) - np.asarray(gemm), 0.0)


def p2p_time(hw: Hardware, size, stride, crosses=None):
    """One send between neighbouring pipeline stages, ``stride`` ranks apart.

    ``crosses``: whether this message leaves its node (None: it does when the stages are a node or more
    apart; :func:`pipeline_hop_crosses` says it for one hop of a pipeline narrower than a node).
    """
    if crosses is None:
        crosses = np.asarray(stride, dtype=float) >= hw.node.gpus
    inner, outer = hw.tiers[0], hw.tiers[1]
    size = np.asarray(size, dtype=float)
    t_in = inner.latency_us * 1e-6 + size / (inner.achieved_gbps * 1e9)
    t_out = outer.latency_us * 1e-6 + size / (outer.achieved_gbps * 1e9)
    return np.where(crosses, t_out, t_in)


def pipeline_hop_crosses(hw: Hardware, stride, stage, peer, offset=0):
    """Whether the message of one rank of pipeline stage ``stage`` to ``peer`` leaves its node.

    The pipeline axis is the outermost of the rank order (:mod:`stageopt.parallel.ranks`): stage ``s``
    holds ranks ``s * stride`` to ``(s + 1) * stride - 1``, and its rank ``s * stride + offset`` talks to
    ``peer * stride + offset``. A pipeline whose stages are narrower than a node (stride < gpus a node)
    keeps most hops inside a node but crosses between nodes at some; a blocking schedule waits for the
    slow hop every micro-batch. Arguments broadcast.
    """
    stride, stage, peer, offset = (np.asarray(x, dtype=float) for x in (stride, stage, peer, offset))
    node = float(hw.node.gpus)
    return np.floor((stage * stride + offset) / node) != np.floor((peer * stride + offset) / node)


def pipeline_path_time(hw: Hardware, size, stride, pp: int):
    """Seconds for one ``size``-byte activation to pass a pipeline's ``pp - 1`` hops in turn (a serving step's
    tokens through every stage): each hop at the slower of its stages' ranks, a hop between nodes at the
    scale-out tier. Broadcasts over ``size``."""
    size = np.asarray(size, dtype=float)
    hops = np.arange(max(pp - 1, 0))
    crosses = (pipeline_hop_crosses(hw, stride, hops, hops + 1, 0)
               | pipeline_hop_crosses(hw, stride, hops, hops + 1, stride - 1))
    return p2p_time(hw, size[..., None], stride, crosses).sum(axis=-1)


def pipeline_message_time(hw: Hardware, plan, boundary, tp, stride, crosses=None):
    """One pipeline message of a ``boundary``-byte activation between stages ``stride`` ranks apart
    (``crosses``: as :func:`p2p_time`).

    Under scatter-gather (``plan.p2p_scatter_gather``) each TP rank sends its 1/tp
    shard and the receiver re-gathers the activation over the TP group.
    """
    if not plan.p2p_scatter_gather:
        return p2p_time(hw, boundary, stride, crosses)
    boundary = np.asarray(boundary, dtype=float)
    return p2p_time(hw, boundary / tp, stride, crosses) + collective_time(hw, "all_gather", boundary, tp, 1)
