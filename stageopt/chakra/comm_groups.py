"""ASTRA-sim's communicator-group file: ``{"<id>": [rank, ...], ...}``.

ASTRA-sim reads it with ``--comm-group-configuration``; a collective's
``pg_name`` attribute names one of these ids. Id 0 and "" mean "all ranks", so
file ids must be positive. Reading accepts singleton groups (STAGE writes
them); the validator reports them, and writing refuses them unless asked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

from stageopt.errors import ConfigError
from stageopt.inputs.gate import load_document, shorten
from stageopt.inputs.limits import MAX_GPUS

GROUP_FILE_MAX_BYTES = 2**30  # 10^7 ranks, each listed in a few groups, fit well within 1 GiB of JSON


def _check_group(path: os.PathLike | str, gid: object, ranks: object) -> list[int]:
    """One group's ranks as ints, or a ConfigError naming the id and the fix."""
    if not isinstance(ranks, (list, tuple)) or not ranks:
        raise ConfigError(f"{path}: group {shorten(gid)} must be a non-empty list of ranks, got {shorten(ranks)}")
    out: list[int] = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < MAX_GPUS:
            raise ConfigError(f"{path}: group {shorten(gid)} has rank {shorten(r)}; ranks are integers from 0 "
                              f"below {MAX_GPUS:.0e} (the bound on GPUs)")
        out.append(int(r))
    if len(set(out)) != len(out):
        seen: set[int] = set()
        dup = sorted({r for r in out if r in seen or seen.add(r)})  # type: ignore[func-returns-value]
        raise ConfigError(f"{path}: group {shorten(gid)} lists rank(s) {shorten(dup)} more than once; "
                          "list each rank once")
    return out


def _check_id(path: os.PathLike | str, key: object) -> int:
    """Group ids are positive integers (0 is reserved for "all ranks")."""
    try:
        gid = int(key)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: group id {shorten(key)} is not an integer; use ids 1, 2, 3, ...") from None
    if isinstance(key, bool) or gid <= 0 or (isinstance(key, str) and key != str(gid)):
        raise ConfigError(f"{path}: group id {shorten(key)} is invalid; ids are positive integers written plainly "
                          "(0 and \"\" mean all ranks)")
    return gid


def read_comm_groups(path: os.PathLike | str) -> dict[int, list[int]]:
    """Parse and check a group file; returns ``{id: [ranks]}`` in file order."""
    data = load_document(path, "comm-group file", json_file=True, max_bytes=GROUP_FILE_MAX_BYTES)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object {{\"<id>\": [ranks...]}}, got {type(data).__name__}")
    return {_check_id(path, k): _check_group(path, k, v) for k, v in data.items()}


def check_groups_fit(groups: Mapping[int, Iterable[int]], world: int, path: os.PathLike | str, source: str) -> None:
    """Refuse a group naming a rank at or above ``world`` (``source`` says where ``world`` came from)."""
    for gid, ranks in groups.items():
        bad = [r for r in ranks if r >= world]
        if bad:
            raise ConfigError(f"{path}: group {gid} has rank(s) {shorten(bad)}, but {source} has {world} ranks "
                              f"(0..{world - 1}); remove them or fix the group file")


def write_comm_groups(
    path: os.PathLike | str,
    groups: Mapping[int, Iterable[int]],
    *,
    allow_singletons: bool = False,
) -> None:
    """Write groups sorted by id, one deterministic line, in STAGE/ASTRA-sim's layout.

    A one-rank group is refused by default: a collective over one rank is a
    no-op that ASTRA-sim still simulates as a ring, so drop the collective instead.
    """
    checked: dict[int, list[int]] = {}
    for key, ranks in groups.items():
        gid = _check_id(path, key)
        if gid in checked:
            raise ConfigError(f"{path}: group id {gid} given twice; ids must be unique")
        members = _check_group(path, gid, list(ranks))
        if len(members) == 1 and not allow_singletons:
            raise ConfigError(
                f"{path}: group {gid} has a single rank {members}; drop it and its collectives "
                "(or pass allow_singletons=True)"
            )
        checked[gid] = members
    text = json.dumps({str(g): checked[g] for g in sorted(checked)})
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    except OSError as err:
        raise ConfigError(f"cannot write comm-group file {path}: {err.strerror}") from err
