"""Where each model stage runs: which pipeline rank, which local chunk, which model copy.

Why apart from the schedules' step orders: the placement decides what a stage
holds (layers, parameters, memory) and who it talks to, whatever the order of
its work. Three shapes exist:

* **looped** (GPipe, 1F1B, interleaved 1F1B, ZB-H1): model stage ``k`` of
  ``pp * vpp`` runs on rank ``k % pp`` as local chunk ``k // pp`` (Megatron's
  assignment; with vpp=1 stage ``k`` is rank ``k``).
* **V-shaped** (ZB-V, DualPipeV): ``2 * pp`` model stages; rank ``r`` holds
  stage ``r`` and stage ``2pp - 1 - r``, so the first and last model stage sit
  on rank 0 and the turn at the middle needs no message (Qi et al. 2024).
* **bidirectional** (DualPipe, DeepSeek-AI 2024): two copies of a ``pp``-stage
  model; copy 0 runs from rank 0 to rank pp-1, copy 1 from rank pp-1 to rank
  0, so rank ``r`` holds stage ``r`` of copy 0 and stage ``pp-1-r`` of copy 1
  (twice the parameters of one stage per rank).
"""

from __future__ import annotations

from dataclasses import dataclass

LOOPED = ("gpipe", "1f1b", "interleaved", "zbh1", "zb2p")
V_SHAPED = ("zbv", "dualpipev")
BIDIRECTIONAL = ("dualpipe",)
SPLIT_BACKWARD = ("zbh1", "zb2p", "zbv", "dualpipe", "dualpipev")  # schedules that run weight gradients apart


@dataclass(frozen=True, slots=True)
class ChunkPlace:
    """A local chunk of a rank: which model stage of which copy it runs."""

    stage: int  # pipeline rank
    local: int
    model_stage: int
    copy: int = 0


def model_stage_count(schedule: str, pp: int, vpp: int) -> int:
    """Model stages of one model copy."""
    return pp if schedule in BIDIRECTIONAL else pp * vpp


def chunks_per_rank(schedule: str, vpp: int) -> int:
    return 2 if schedule in BIDIRECTIONAL else vpp


def rank_chunks(schedule: str, pp: int, vpp: int, stage: int) -> list[ChunkPlace]:
    """The chunks rank ``stage`` holds, in local order."""
    if schedule in BIDIRECTIONAL:
        return [ChunkPlace(stage, 0, stage, 0), ChunkPlace(stage, 1, pp - 1 - stage, 1)]
    if schedule in V_SHAPED:
        return [ChunkPlace(stage, 0, stage), ChunkPlace(stage, 1, 2 * pp - 1 - stage)]
    return [ChunkPlace(stage, local, local * pp + stage) for local in range(vpp)]


def rank_of_model_stage(schedule: str, pp: int, model_stage: int, copy: int = 0) -> int:
    if schedule in BIDIRECTIONAL:
        return model_stage if copy == 0 else pp - 1 - model_stage
    if schedule in V_SHAPED:
        return model_stage if model_stage < pp else 2 * pp - 1 - model_stage
    return model_stage % pp


def neighbour(schedule: str, pp: int, n_model: int, place: ChunkPlace, step: int) -> str:
    """Where model stage ``place.model_stage + step`` of the same copy runs, seen from ``place.stage``.

    ``"next"`` (rank + 1, wrapping), ``"prev"`` (rank - 1, wrapping), ``"self"``
    (the same rank: the V's turn) or ``""`` when the model has no such stage
    (``n_model`` stages per copy).
    """
    target = place.model_stage + step
    if not 0 <= target < n_model:
        return ""
    if rank_of_model_stage(schedule, pp, target, place.copy) == place.stage:
        return "self"
    backwards = (schedule in V_SHAPED and place.model_stage >= pp) or (schedule in BIDIRECTIONAL and place.copy)
    return "next" if (step > 0) != backwards else "prev"
