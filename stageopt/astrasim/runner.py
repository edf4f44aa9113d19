"""Run the external ASTRA-sim binary once and parse what it prints, strictly.

Why strict: ASTRA-sim can crash at exit, lose asynchronous log lines, or print a
``[critical]`` line and carry on; a wrapper that returns whatever numbers it
found would feed a partial result into a search as if it were real. Every way
a run can go wrong is a distinct :class:`~stageopt.errors.SimulatorError`
subclass with a one-line message that says what to do.

Finding the binary (no other search, so runs are reproducible):

1. the ``binary`` argument (the CLI's ``--astra-sim PATH``), else
2. the environment variable ``STAGEOPT_ASTRA_SIM``.

Either may be a path or a bare command name found on ``PATH``; typically the
analytical backend, ``AstraSim_Analytical_Congestion_Unaware``.

Each run gets its own temporary working directory (``--logging-folder`` inside
it), its own process group (``start_new_session=True``) and a timeout that
kills the whole group with ``os.killpg``.

The known fault of ASTRA-sim 518bd51 (abort with exit 134,
``malloc_consolidate(): unaligned fastbin chunk detected``, at teardown when
communicator groups are smaller than the world) is handled so: if every rank's
``finished`` line survived, the numbers were computed before the crash and are
complete, so they are returned with ``known_exit_fault=True`` (callers can see
and count it; ``allow_known_exit_fault=False`` makes it an error instead). If
any rank's line was lost, :class:`AstraSimKnownExitFault` is raised: a partial
result is never returned.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from stageopt.errors import ConfigError, SimulatorError

ENV_VAR = "STAGEOPT_ASTRA_SIM"
DEFAULT_TIMEOUT_S = 600.0

_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles\.\s*$")
_FINISHED_HINT = re.compile(r"sys\[[^\]]*\]\s*finished")
_CRITICAL = re.compile(r"\[critical\]")
_EXITING = re.compile(r"\] Exiting\s*$")
_KNOWN_FAULT_TEXT = ("malloc_consolidate", "unaligned fastbin chunk")
_ABORT_CODES = (134, -signal.SIGABRT)


class AstraSimNotFound(SimulatorError):
    """No binary given, or the given path is missing or not executable."""


class AstraSimCrashed(SimulatorError):
    """The process exited non-zero (other than the known exit fault)."""


class AstraSimKnownExitFault(SimulatorError):
    """The known exit-134 teardown abort, with some ranks' results lost (or not accepted)."""


class AstraSimTimeout(SimulatorError):
    """The run exceeded its time limit; its process group was killed."""


class AstraSimOutputError(SimulatorError):
    """Output that cannot be trusted: malformed, incomplete, or with a [critical] line."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AstraSimResult:
    """Per-rank finish time and exposed communication, in cycles (1 cycle = 1 ns)."""

    per_rank_cycles: tuple[int, ...]
    per_rank_exposed_comm: tuple[int, ...]
    exit_code: int = 0
    known_exit_fault: bool = False
    wall_s: float | None = None  # seconds the simulator process ran, when it was run here

    @property
    def n_ranks(self) -> int:
        return len(self.per_rank_cycles)

    @property
    def max_cycles(self) -> int:
        """The step time in cycles: the slowest rank."""
        return max(self.per_rank_cycles)

    @property
    def step_time_s(self) -> float:
        return self.max_cycles * 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class LogScan:
    """Everything the parser recognised in one output, before judging completeness."""

    finished: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (cycles, exposed)
    exiting: bool = False
    critical: tuple[str, ...] = ()
    malformed: tuple[str, ...] = ()


def scan_log(text: str) -> LogScan:
    """Collect ``finished`` lines, ``[critical]`` lines and the ``Exiting`` line.

    A line that mentions a rank finishing but does not match the format, a rank
    reported twice, or exposed communication above the rank's total time is
    recorded as malformed.
    """
    finished: dict[int, tuple[int, int]] = {}
    critical: list[str] = []
    malformed: list[str] = []
    exiting = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _CRITICAL.search(line):
            critical.append(f"line {number}: {line.strip()}")
            continue
        if _EXITING.search(line):
            exiting = True
            continue
        match = _FINISHED.search(line)
        if match:
            rank, cycles, exposed = (int(g) for g in match.groups())
            if rank in finished:
                malformed.append(f"line {number}: rank {rank} reported twice")
            elif exposed > cycles:
                malformed.append(f"line {number}: rank {rank} exposed communication {exposed} > total {cycles}")
            else:
                finished[rank] = (cycles, exposed)
        elif _FINISHED_HINT.search(line):
            malformed.append(f"line {number}: unrecognised 'finished' line {line.strip()[:120]!r}")
    return LogScan(finished=finished, exiting=exiting, critical=tuple(critical), malformed=tuple(malformed))


def _missing_ranks(scan: LogScan, n_ranks: int) -> list[int]:
    return [r for r in range(n_ranks) if r not in scan.finished]


def _describe_ranks(ranks: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def _check_scan(scan: LogScan, n_ranks: int, *, need_exiting: bool) -> None:
    """Raise AstraSimOutputError unless ``scan`` is a complete, clean run of ``n_ranks``."""
    if scan.critical:
        raise AstraSimOutputError(f"ASTRA-sim printed a [critical] line ({scan.critical[0]}); "
                                  f"fix the input it names and rerun")
    if scan.malformed:
        raise AstraSimOutputError(f"ASTRA-sim output not understood ({scan.malformed[0]}); "
                                  f"check the binary version (expected commit 518bd51 format)")
    extra = sorted(r for r in scan.finished if not 0 <= r < n_ranks)
    if extra:
        raise AstraSimOutputError(f"ASTRA-sim reported rank(s) {_describe_ranks(extra)} but the run has "
                                  f"{n_ranks} ranks; check that n_ranks matches the network config")
    missing = _missing_ranks(scan, n_ranks)
    if missing:
        raise AstraSimOutputError(f"ASTRA-sim output lacks the 'finished' line of {len(missing)} of {n_ranks} "
                                  f"rank(s) ({_describe_ranks(missing)}); the run is incomplete, rerun it")
    if need_exiting and not scan.exiting:
        raise AstraSimOutputError("ASTRA-sim output has no final 'Exiting' line; the run did not end "
                                  "cleanly, rerun it and check its stderr")


def _result(scan: LogScan, n_ranks: int, **extra: object) -> AstraSimResult:
    cycles = tuple(scan.finished[r][0] for r in range(n_ranks))
    exposed = tuple(scan.finished[r][1] for r in range(n_ranks))
    return AstraSimResult(per_rank_cycles=cycles, per_rank_exposed_comm=exposed, **extra)  # type: ignore[arg-type]


def parse_astra_sim_output(text: str, n_ranks: int) -> AstraSimResult:
    """Parse the stdout of a successful run: every rank once, no [critical], an Exiting line."""
    if n_ranks < 1:
        raise ConfigError(f"n_ranks={n_ranks} must be >= 1")
    scan = scan_log(text)
    _check_scan(scan, n_ranks, need_exiting=True)
    return _result(scan, n_ranks)


# ----------------------------------------------------------------------------- running


def find_astra_sim(binary: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the binary from ``binary`` or ``$STAGEOPT_ASTRA_SIM`` (see module docstring)."""
    source = "--astra-sim"
    if binary is None or str(binary) == "":
        binary = os.environ.get(ENV_VAR) or None
        source = ENV_VAR
    if binary is None:
        raise AstraSimNotFound(f"no ASTRA-sim binary given; pass --astra-sim PATH or set {ENV_VAR} to the built "
                               f"AstraSim_Analytical_Congestion_Unaware")
    text = str(binary)
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


def ranks_in_network(network: Path) -> int:
    """Number of ranks a network YAML describes: the product of ``npus_count``."""
    try:
        data = yaml.safe_load(Path(network).read_text(encoding="utf-8"))
        counts = data["npus_count"]
        total = math.prod(int(c) for c in counts)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{network}: cannot read npus_count ({type(err).__name__}); "
                          f"pass n_ranks or fix the network config") from None
    if total < 1:
        raise ConfigError(f"{network}: npus_count multiplies to {total}; give positive counts")
    return total


def _existing(path: os.PathLike[str] | str, what: str) -> Path:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise ConfigError(f"ASTRA-sim {what} file {str(path)!r} not found; write it first "
                          f"(stageopt generate) or fix the path")
    return resolved


@dataclass(frozen=True, kw_only=True, slots=True)
class _Completed:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


def _run_group(argv: list[str], cwd: Path, timeout_s: float) -> _Completed:
    """Run ``argv`` in a new session; on timeout (or interrupt) kill its whole process group."""
    env = dict(os.environ, LIBC_FATAL_STDERR_="1")  # glibc abort messages to stderr, not /dev/tty
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    except OSError as err:
        raise AstraSimNotFound(f"cannot start ASTRA-sim {argv[0]!r}: {err.strerror}; "
                               f"check that it is a binary built for this machine") from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        raise AstraSimTimeout(f"ASTRA-sim ran past its {timeout_s:g} s limit and was killed; raise the timeout "
                              f"or simulate fewer ranks / micro-batches") from None
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise
    return _Completed(returncode=proc.returncode, stdout=stdout, stderr=stderr, wall_s=time.monotonic() - start)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session leader's pid is the group id
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def _judge(done: _Completed, n_ranks: int, allow_known_exit_fault: bool) -> AstraSimResult:
    """Turn a finished process into a result or the one error that describes it."""
    scan = scan_log(done.stdout)
    code = done.returncode
    both = done.stdout + "\n" + done.stderr
    if code in _ABORT_CODES and any(t in both for t in _KNOWN_FAULT_TEXT) and not scan.critical:
        missing = _missing_ranks(scan, n_ranks)
        if missing or scan.malformed:
            lost = f"{len(missing)} of {n_ranks} ranks' results were lost ({_describe_ranks(missing)})" \
                if missing else f"output is damaged ({scan.malformed[0]})"
            raise AstraSimKnownExitFault(
                f"ASTRA-sim hit its known exit fault (exit 134, malloc_consolidate) and {lost}; rerun it, "
                f"or use communicator groups spanning all ranks to avoid the fault")
        _check_scan(scan, n_ranks, need_exiting=False)
        if not allow_known_exit_fault:
            raise AstraSimKnownExitFault(
                f"ASTRA-sim hit its known exit fault (exit 134, malloc_consolidate) after all {n_ranks} ranks "
                f"finished; pass allow_known_exit_fault=True to accept the complete numbers")
        return _result(scan, n_ranks, exit_code=code, known_exit_fault=True, wall_s=done.wall_s)
    if code != 0:
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        got = f"{len(scan.finished)} of {n_ranks} ranks finished"
        detail = scan.critical[0] if scan.critical else _last_line(done.stderr or done.stdout)
        raise AstraSimCrashed(f"ASTRA-sim failed with {how} ({got}; last message: {detail}); "
                              f"check its inputs and the log folder")
    _check_scan(scan, n_ranks, need_exiting=True)
    return _result(scan, n_ranks, exit_code=0, wall_s=done.wall_s)


def run_astra_sim(*, workload: os.PathLike[str] | str, system: os.PathLike[str] | str,
                  network: os.PathLike[str] | str, memory: os.PathLike[str] | str,
                  comm_groups: os.PathLike[str] | str | None = None, n_ranks: int | None = None,
                  binary: str | os.PathLike[str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  allow_known_exit_fault: bool = True, workdir: os.PathLike[str] | str | None = None,
                  extra_args: Sequence[str] = ()) -> AstraSimResult:
    """Run ASTRA-sim on ``workload`` (trace prefix: rank i reads ``<prefix>.<i>.et``).

    ``n_ranks`` defaults to the product of the network's ``npus_count``.
    ``workdir`` keeps the run's working directory (and ``log/``) for inspection;
    by default a temporary directory is used and removed.
    """
    exe = find_astra_sim(binary)
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s={timeout_s!r} must be > 0; give seconds, e.g. 600")
    system_p, network_p, memory_p = (_existing(system, "system"), _existing(network, "network"),
                                     _existing(memory, "memory"))
    groups_p = _existing(comm_groups, "communicator-group") if comm_groups is not None else None
    ranks = ranks_in_network(network_p) if n_ranks is None else n_ranks
    if ranks < 1:
        raise ConfigError(f"n_ranks={ranks} must be >= 1")
    prefix = Path(workload).expanduser().resolve()
    for rank in sorted({0, ranks - 1}):
        _existing(f"{prefix}.{rank}.et", f"trace (rank {rank})")

    def argv(run_dir: Path) -> list[str]:
        args = [str(exe), f"--workload-configuration={prefix}", f"--system-configuration={system_p}",
                f"--network-configuration={network_p}", f"--remote-memory-configuration={memory_p}",
                f"--logging-folder={run_dir / 'log'}"]
        if groups_p is not None:
            args.append(f"--comm-group-configuration={groups_p}")
        return args + list(extra_args)

    if workdir is not None:
        run_dir = Path(workdir).expanduser().resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        return _judge(_run_group(argv(run_dir), run_dir, timeout_s), ranks, allow_known_exit_fault)
    with tempfile.TemporaryDirectory(prefix="stageopt-astrasim-") as tmp:
        run_dir = Path(tmp)
        return _judge(_run_group(argv(run_dir), run_dir, timeout_s), ranks, allow_known_exit_fault)
