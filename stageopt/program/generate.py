"""Write a complete ASTRA-sim input set for one model, plan and machine.

``DIR/<prefix>.<rank>.et`` for each requested rank, ``DIR/comm_groups.json``,
``DIR/system.json``, ``DIR/network.yml``, ``DIR/memory.json`` and
``DIR/run_astrasim.sh`` (runs the binary named by ``STAGEOPT_ASTRA_SIM``).

Scale by symmetry: one program and one serialized template per pipeline
stage; a rank costs one dictionary of substitutions and one splice of the
template's bytes, so the work is proportional to the bytes written. Group
ids come from array lookups (:mod:`stageopt.program.groups`), never from
searching groups per rank.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stageopt.astrasim.config_writer import astra_sim_configs, write_astra_sim_configs
from stageopt.astrasim.runner import ENV_VAR
from stageopt.chakra import TraceTemplate, write_comm_groups
from stageopt.console import progress as console_progress
from stageopt.errors import ConfigError
from stageopt.hardware import Hardware
from stageopt.parallel.ranks import group_size
from stageopt.program.chakra_emit import compute_micros, rank_patches, stage_template
from stageopt.program.durations import node_durations
from stageopt.program.groups import GroupTable
from stageopt.program.nodes import StageProgram
from stageopt.program.stage_program import ProgramOptions, build_programs
from stageopt.program.tier_split import split_buckets, split_kinds, split_program
from stageopt.workload import Workload

SCRIPT_NAME = "run_astrasim.sh"
GROUPS_NAME = "comm_groups.json"


@dataclass(frozen=True)
class GenerateResult:
    """What :func:`generate` wrote."""

    out_dir: Path
    prefix: str
    ranks: int  # trace files written
    world: int
    bytes_written: int  # trace bytes
    files: tuple[Path, ...]  # non-trace files
    command: str
    programs: tuple[StageProgram, ...] = ()  # the stage programs as written (kernel times, split collectives)
    system: dict | None = None  # the system.json written


def parse_ranks(text: str | None, world: int) -> list[int]:
    """``"0-7,12"`` -> [0..7, 12]; None -> every rank. Errors name the bad item and the range."""
    if text is None:
        return list(range(world))
    out: set[int] = set()
    for item in text.replace(" ", "").split(","):
        lo, sep, hi = item.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ConfigError(f"--ranks item '{item}' is not N or N-M; write e.g. --ranks 0-7,12") from None
        if first > last:
            raise ConfigError(f"--ranks item '{item}' runs backwards; write {last}-{first}")
        if first < 0 or last >= world:
            raise ConfigError(f"--ranks {item}: ranks are 0..{world - 1} for {world} GPUs; stay inside that range")
        out.update(range(first, last + 1))
    return sorted(out)


def prepare_out_dir(out: Path) -> Path:
    """Create ``out`` (and parents) and check that files can be written into it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"--out {out}: exists and is not a directory; choose a directory path") from None
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot create it ({err.strerror}); choose a writable directory") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: directory is not writable; choose a writable directory")
    return out


def astra_command(out: Path, prefix: str) -> str:
    """The ASTRA-sim command line for a generated set (binary from ``$STAGEOPT_ASTRA_SIM``)."""
    d = shlex.quote(str(out))
    return (f'"${ENV_VAR}" --workload-configuration={d}/{prefix} --comm-group-configuration={d}/{GROUPS_NAME} '
            f"--system-configuration={d}/system.json --remote-memory-configuration={d}/memory.json "
            f"--network-configuration={d}/network.yml")


def _write_script(out: Path, prefix: str) -> Path:
    path = out / SCRIPT_NAME
    text = f"""#!/bin/sh
# Run ASTRA-sim on this trace set (written by `stageopt generate`).
# Set {ENV_VAR} to the analytical binary, e.g. AstraSim_Analytical_Congestion_Unaware.
set -eu
cd "$(dirname "$0")"
exec "${{{ENV_VAR}:?set {ENV_VAR} to the ASTRA-sim binary}}" \\
  --workload-configuration=./{prefix} \\
  --comm-group-configuration=./{GROUPS_NAME} \\
  --system-configuration=./system.json \\
  --remote-memory-configuration=./memory.json \\
  --network-configuration=./network.yml \\
  --logging-folder=./log "$@"
"""
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def _write_bytes(path: str, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as err:
        raise ConfigError(f"cannot write trace {path}: {err.strerror}") from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as err:
        raise ConfigError(f"cannot write trace {path}: {err.strerror}") from None
    finally:
        os.close(fd)


def lowered_programs(work: Workload, hw: Hardware, options: ProgramOptions | None = None
                     ) -> tuple[list[StageProgram], list[np.ndarray]]:
    """The stage programs as written: kernel times in whole microseconds, data-parallel collectives in
    their buckets, node-spanning collectives split by tier.

    Durations come from :func:`stageopt.program.durations.node_durations`, the
    replay's own numbers, so a change to the kernel model reaches the traces.
    """
    programs = build_programs(work, options)
    split = split_kinds(work.plan, set().union(*(p.groups_used() for p in programs)), hw.node.gpus)
    out = [split_program(*split_buckets(p, compute_micros(p, node_durations(p, work, hw)), work.plan), split)
           for p in programs]
    return [p for p, _ in out], [m for _, m in out]


def generate(work: Workload, hw: Hardware, out: Path | str, *, ranks: Sequence[int] | None = None,
             prefix: str = "workload", options: ProgramOptions | None = None,
             progress: bool = False) -> GenerateResult:
    """Write the trace set for ``ranks`` (default: all) and the files ASTRA-sim needs beside it.

    ``progress``: show ranks written, rate and ETA on stderr (a live bar on a terminal,
    a status line every few seconds in a log; silent when the work is short).
    """
    plan = work.plan
    world = plan.gpus
    astra_sim_configs(hw, world, dtype=plan.dtype)  # a machine that cannot hold the ranks fails before any write
    out = prepare_out_dir(Path(out))
    todo = list(range(world)) if ranks is None else list(ranks)
    programs, micros = lowered_programs(work, hw, options)
    kinds = set().union(*(p.groups_used() for p in programs))
    groups = GroupTable(plan, kinds, hw.node.gpus)
    whole_world = any("@" not in k and group_size(plan, k) == world for k in kinds)
    configs = write_astra_sim_configs(hw, world, out, dtype=plan.dtype, subgroups_only=not whole_world,
                                      host_copies=plan.offload_layers > 0)
    system = json.loads(configs.system.read_text(encoding="utf-8"))
    write_comm_groups(out / GROUPS_NAME, groups.comm_groups())
    per_stage = world // plan.pp
    templates: dict[int, TraceTemplate] = {}
    written = 0
    base = os.path.join(str(out), prefix)
    with console_progress(len(todo), "writing traces", unit="rank", enabled=progress) as bar:
        for rank in todo:
            stage = rank // per_stage
            template = templates.get(stage)
            if template is None:
                template = templates[stage] = stage_template(programs[stage], micros[stage])
            data = template.render(rank_patches(plan, groups, rank))
            _write_bytes(f"{base}.{rank}.et", data)
            written += len(data)
            bar.update()
    script = _write_script(out, prefix)
    files = (out / GROUPS_NAME, configs.system, configs.network, configs.memory, script)
    return GenerateResult(out_dir=out, prefix=prefix, ranks=len(todo), world=world, bytes_written=written,
                          files=files, command=astra_command(out, prefix), programs=tuple(programs), system=system)
