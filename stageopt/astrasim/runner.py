"""Run the external ASTRA-sim binary and return its per-rank results, or the one error that explains why not.

Finding the binary (no other search, so runs are reproducible):

1. the ``binary`` argument (the CLI's ``--astra-sim PATH``), else
2. the environment variable ``STAGEOPT_ASTRA_SIM``.

Either may be a path or a bare command name found on ``PATH``; typically the
analytical backend, ``AstraSim_Analytical_Congestion_Unaware``. With
``network="aware"`` the congestion-aware binary is used instead:
``$STAGEOPT_ASTRA_SIM_AWARE`` if set, else ``AstraSim_Analytical_Congestion_Aware``
beside the unaware one. It simulates 1-D networks only (at commit 518bd51), so a
multi-dimensional network is refused before the run, in one line.

Each run gets its own working directory (``--logging-folder`` inside it) and
runs under :func:`stageopt.astrasim.process.run_tree`: its own process group,
its descendants tracked and killed with it (on timeout, on SIGTERM/SIGINT to
stageopt, and when it ends), its output read line by line.

The known fault of ASTRA-sim 518bd51 (abort with exit 134,
``malloc_consolidate(): unaligned fastbin chunk detected``, at teardown when
communicator groups are smaller than the world) used to cost results: its
loggers are asynchronous, so lines still queued when the abort hits were lost.
Each run therefore passes a ``--logging-configuration`` that makes the two
loggers stageopt reads (``workload``: the ``finished`` lines; ``system``:
``Exiting``) synchronous and flushed per line, also into ``results.log`` in the
run directory (read if stdout came up short). Measured on the reference
8-GPU set: without it 3 of 10 runs lost lines, with it 0 of 10 (the abort
then sometimes shows as SIGSEGV, also at teardown). If every rank's
``finished`` line is there, the numbers were computed before the crash and are
complete: they are returned with ``known_exit_fault=True``. If lines are still missing,
the run is repeated (``retries`` times); a partial result is never returned.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml

from stageopt.astrasim.output import (
    KEYWORDS,
    AstraSimCrashed,
    AstraSimKnownExitFault,
    AstraSimNotFound,
    AstraSimOutputError,
    AstraSimResult,
    AstraSimTimeout,
    LogScan,
    LogScanner,
    check_scan,
    describe_ranks,
    missing_ranks,
    parse_astra_sim_output,
    result_of,
    scan_log,
)
from stageopt.astrasim.process import (
    OUTPUT_LIMIT_BYTES,
    Completed,
    OutputTooLarge,
    RunTimeout,
    read_lines,
    run_tree,
)
from stageopt.errors import ConfigError

__all__ = ["AWARE_ENV_VAR", "ENV_VAR", "NETWORKS", "AstraSimCrashed", "AstraSimKnownExitFault", "AstraSimNotFound",
           "AstraSimOutputError", "AstraSimResult", "AstraSimTimeout", "find_astra_sim", "parse_astra_sim_output",
           "ranks_in_network", "run_astra_sim", "scan_log"]

ENV_VAR = "STAGEOPT_ASTRA_SIM"
AWARE_ENV_VAR = "STAGEOPT_ASTRA_SIM_AWARE"
AWARE_NAME = "AstraSim_Analytical_Congestion_Aware"
NETWORKS = ("unaware", "aware")
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_RETRIES = 2
RESULTS_LOG = "results.log"
_KNOWN_FAULT_TEXT = ("malloc_consolidate", "unaligned fastbin chunk")
_ABORT_CODES = (134, -signal.SIGABRT)
_SEGV_CODES = (139, -signal.SIGSEGV)
_LOGGING_CONFIG = """\
# Written by stageopt: the loggers whose lines stageopt reads, synchronous and flushed per line,
# so an abort at teardown cannot drop them (ASTRA-sim's own loggers are asynchronous).
[[sink]]
name = "stageopt_results"
type = "basic_file_sink_st"
filename = "{results}"
truncate = true

[[logger]]
name = "workload"
sinks = ["stageopt_results"]
level = "info"
flush_level = "info"

[[logger]]
name = "system"
sinks = ["stageopt_results"]
level = "info"
flush_level = "info"
"""


def _resolve(text: str, source: str) -> Path:
    if os.sep not in text and not Path(text).exists():
        found = shutil.which(text)
        if found is None:
            raise AstraSimNotFound(f"{source}={text!r}: no such command on PATH; give the binary's full path")
        text = found
    path = Path(text).expanduser()
    if not path.is_file():
        raise AstraSimNotFound(f"{source}={text!r}: no such file; build ASTRA-sim or fix the path")
    if not os.access(path, os.X_OK):
        raise AstraSimNotFound(f"{source}={text!r} is not executable; chmod +x it or point to the built binary")
    return path.resolve()


def find_astra_sim(binary: str | os.PathLike[str] | None = None, network: str = "unaware") -> Path:
    """Resolve the binary for ``network`` (``unaware`` or ``aware``; see the module docstring)."""
    if network not in NETWORKS:
        raise ConfigError(f"--astra-sim-network {network!r} is unknown; use one of {', '.join(NETWORKS)}")
    explicit = binary is not None and str(binary) != ""
    if network == "aware" and not explicit and os.environ.get(AWARE_ENV_VAR):
        return _resolve(os.environ[AWARE_ENV_VAR], AWARE_ENV_VAR)
    source = "--astra-sim"
    if not explicit:
        binary = os.environ.get(ENV_VAR) or None
        source = ENV_VAR
    if binary is None:
        raise AstraSimNotFound(f"no ASTRA-sim binary given; pass --astra-sim PATH or set {ENV_VAR} to the built "
                               f"AstraSim_Analytical_Congestion_Unaware")
    path = _resolve(str(binary), source)
    if network == "unaware":
        return path
    beside = path.parent / AWARE_NAME
    if not (beside.is_file() and os.access(beside, os.X_OK)):
        raise AstraSimNotFound(f"--astra-sim-network aware: no executable {AWARE_NAME} beside {path}; build it "
                               f"there or set {AWARE_ENV_VAR} to the congestion-aware binary")
    return beside.resolve()


def _network_counts(network: Path) -> list[int]:
    try:
        data = yaml.safe_load(Path(network).read_text(encoding="utf-8"))
        return [int(c) for c in data["npus_count"]]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{network}: cannot read npus_count ({type(err).__name__}); "
                          f"pass n_ranks or fix the network config") from None


def ranks_in_network(network: Path) -> int:
    """Number of ranks a network YAML describes: the product of ``npus_count``."""
    total = math.prod(_network_counts(network))
    if total < 1:
        raise ConfigError(f"{network}: npus_count multiplies to {total}; give positive counts")
    return total


def require_one_dimension(dims: int, where: str) -> None:
    """The congestion-aware binary (518bd51) simulates 1-D networks only: say so before running it."""
    if dims > 1:
        raise ConfigError(f"--astra-sim-network aware: ASTRA-sim's congestion-aware backend simulates 1-D networks "
                          f"only, and {where} has {dims} dimensions; use --astra-sim-network unaware, or at most "
                          f"one scale-up domain of GPUs")


def _existing(path: os.PathLike[str] | str, what: str) -> Path:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise ConfigError(f"ASTRA-sim {what} file {str(path)!r} not found; write it first "
                          f"(stageopt generate) or fix the path")
    return resolved


def _how(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def _with_results_log(scan: LogScan, run_dir: Path) -> LogScan:
    """Add ranks missing from stdout that ASTRA-sim's flushed results log still holds."""
    path = run_dir / RESULTS_LOG
    if not path.is_file():
        return scan
    scanner = LogScanner()
    with path.open("rb") as f:
        for line, number, _ in read_lines(f, OUTPUT_LIMIT_BYTES, KEYWORDS):
            scanner.feed(line, number)
    logged = scanner.scan()
    finished = {**logged.finished, **scan.finished}
    return LogScan(finished=finished, exiting=scan.exiting or logged.exiting, critical=scan.critical,
                   malformed=scan.malformed, lines=scan.lines)


def _judge(done: Completed, scan: LogScan, n_ranks: int, allow_known_exit_fault: bool) -> AstraSimResult:
    """Turn a finished process into a result or the one error that describes it.

    The known teardown fault shows as SIGABRT (exit 134, ``malloc_consolidate``
    on stderr) or, with the synchronous loggers, sometimes as SIGSEGV; either
    after every rank finished is accepted. A SIGSEGV before that is a crash.
    """
    code = done.returncode
    aborted = code in _ABORT_CODES and any(t in done.stderr_tail for t in _KNOWN_FAULT_TEXT)
    finished_all = not missing_ranks(scan, n_ranks) and not scan.malformed
    if not scan.critical and (aborted or (code in _SEGV_CODES and finished_all)):
        missing = missing_ranks(scan, n_ranks)
        if missing or scan.malformed:
            lost = f"{len(missing)} of {n_ranks} ranks' results were lost ({describe_ranks(missing)})" \
                if missing else f"output is damaged ({scan.malformed[0]})"
            raise AstraSimKnownExitFault(
                f"ASTRA-sim hit its known exit fault (exit 134, malloc_consolidate) and {lost}; rerun it, "
                f"or use communicator groups spanning all ranks to avoid the fault", lost=lost)
        check_scan(scan, n_ranks, need_exiting=False)
        if not allow_known_exit_fault:
            raise AstraSimKnownExitFault(
                f"ASTRA-sim crashed at teardown (its known exit fault, {_how(code)}) after all {n_ranks} ranks "
                f"finished; pass allow_known_exit_fault=True to accept the complete numbers")
        return result_of(scan, n_ranks, exit_code=code, known_exit_fault=True, wall_s=done.wall_s)
    if code != 0:
        got = f"{len(scan.finished)} of {n_ranks} ranks finished"
        detail = scan.critical[0] if scan.critical else _last_line(done.stderr_tail)
        raise AstraSimCrashed(f"ASTRA-sim failed with {_how(code)} ({got}; last message: {detail}); "
                              f"check its inputs and the log folder")
    check_scan(scan, n_ranks, need_exiting=True)
    return result_of(scan, n_ranks, exit_code=0, wall_s=done.wall_s)


def _run_once(argv: list[str], run_dir: Path, timeout_s: float, n_ranks: int,
              allow_known_exit_fault: bool) -> AstraSimResult:
    (run_dir / "logging.toml").write_text(_LOGGING_CONFIG.format(results=run_dir / RESULTS_LOG), encoding="utf-8")
    scanner = LogScanner()
    env = dict(os.environ, LIBC_FATAL_STDERR_="1")  # glibc abort messages to stderr, not /dev/tty
    try:
        done = run_tree(argv + [f"--logging-configuration={run_dir / 'logging.toml'}"], run_dir, timeout_s,
                        scanner.feed, env=env, wanted=KEYWORDS)
    except RunTimeout:
        raise AstraSimTimeout(f"ASTRA-sim ran past its {timeout_s:g} s limit and was killed; raise the timeout "
                              f"or simulate fewer ranks / micro-batches") from None
    except OutputTooLarge:
        raise AstraSimOutputError("ASTRA-sim printed more than 1 GiB and was stopped; that is not a simulation "
                                  "log, check the binary") from None
    except OSError as err:
        raise AstraSimNotFound(f"cannot start ASTRA-sim {argv[0]!r}: {err.strerror}; "
                               f"check that it is a binary built for this machine") from None
    scan = scanner.scan()
    if len(scan.finished) < n_ranks:
        scan = _with_results_log(scan, run_dir)
    return _judge(done, scan, n_ranks, allow_known_exit_fault)


def run_astra_sim(*, workload: os.PathLike[str] | str, system: os.PathLike[str] | str,
                  network: os.PathLike[str] | str, memory: os.PathLike[str] | str,
                  comm_groups: os.PathLike[str] | str | None = None, n_ranks: int | None = None,
                  binary: str | os.PathLike[str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  allow_known_exit_fault: bool = True, workdir: os.PathLike[str] | str | None = None,
                  extra_args: Sequence[str] = (), network_model: str = "unaware",
                  retries: int = DEFAULT_RETRIES) -> AstraSimResult:
    """Run ASTRA-sim on ``workload`` (trace prefix: rank i reads ``<prefix>.<i>.et``).

    ``n_ranks`` defaults to the product of the network's ``npus_count``.
    ``workdir`` keeps the run's working directory (``log/``, ``results.log``)
    for inspection; by default a temporary directory is used and removed.
    ``network_model``: ``unaware`` or ``aware`` (which binary, see
    :func:`find_astra_sim`). ``retries``: reruns after the known exit fault
    lost lines (the simulation is deterministic, so a rerun gives the same numbers).
    """
    exe = find_astra_sim(binary, network_model)
    if retries < 0:
        raise ConfigError(f"retries={retries} must be >= 0")
    if not timeout_s > 0 or math.isinf(timeout_s):
        raise ConfigError(f"timeout_s={timeout_s!r} must be a finite number > 0; give seconds, e.g. 600")
    system_p, network_p, memory_p = (_existing(system, "system"), _existing(network, "network"),
                                     _existing(memory, "memory"))
    groups_p = _existing(comm_groups, "communicator-group") if comm_groups is not None else None
    if network_model == "aware":
        require_one_dimension(len(_network_counts(network_p)), str(network_p))
    ranks = ranks_in_network(network_p) if n_ranks is None else n_ranks
    if ranks < 1:
        raise ConfigError(f"n_ranks={ranks} must be >= 1")
    prefix = Path(workload).expanduser().resolve()
    for rank in sorted({0, ranks - 1}):
        _existing(f"{prefix}.{rank}.et", f"trace (rank {rank})")

    def attempt(run_dir: Path) -> AstraSimResult:
        argv = [str(exe), f"--workload-configuration={prefix}", f"--system-configuration={system_p}",
                f"--network-configuration={network_p}", f"--remote-memory-configuration={memory_p}",
                f"--logging-folder={run_dir / 'log'}"]
        if groups_p is not None:
            argv.append(f"--comm-group-configuration={groups_p}")
        for tries in range(1, retries + 2):
            try:
                result = _run_once(argv + list(extra_args), run_dir, timeout_s, ranks, allow_known_exit_fault)
            except AstraSimKnownExitFault as err:
                if not err.lost or tries > retries:
                    if err.lost:
                        raise AstraSimKnownExitFault(
                            f"ASTRA-sim hit its known exit fault (exit 134, malloc_consolidate) in {tries} run(s) "
                            f"and {err.lost}; use communicator groups spanning all ranks to avoid the fault",
                            lost=err.lost) from None
                    raise
                continue
            return dataclasses.replace(result, attempts=tries)
        raise AssertionError("unreachable")  # pragma: no cover

    if workdir is not None:
        run_dir = Path(workdir).expanduser().resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        return attempt(run_dir)
    with tempfile.TemporaryDirectory(prefix="stageopt-astrasim-") as tmp:
        return attempt(Path(tmp))
