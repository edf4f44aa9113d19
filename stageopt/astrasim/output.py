"""ASTRA-sim's printed output, read strictly and line by line.

Why strict: ASTRA-sim can crash at exit, lose asynchronous log lines, or print
a ``[critical]`` line and carry on; a wrapper that returned whatever numbers it
found would feed a partial result into a search as if it were real. Why line
by line: a run's output is never held whole (a broken or hostile binary may
print hundreds of megabytes); :class:`LogScanner` keeps only what it needs.

Every way a run can go wrong is a distinct :class:`~stageopt.errors.SimulatorError`
subclass with a one-line message that says what to do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from stageopt.errors import ConfigError, SimulatorError

_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles, exposed communication (\d+) cycles\.\s*$")
_FINISHED_HINT = re.compile(r"sys\[[^\]]*\]\s*finished")
# spdlog's default pattern ("[time] [logger] [critical] msg") and ASTRA-sim's own ("[time] [C] <logger>: msg"),
# which its loggers get when a --logging-configuration defines them
_CRITICAL = re.compile(r"\[(?:critical|C)\]")
_EXITING = re.compile(r"(?:\]|>:) Exiting\s*$")
# [critical] lines ASTRA-sim 518bd51 prints that do not bear on the result: its statistics pass, after every
# rank's "finished" line, cannot attribute the overlap of CPU-slot nodes (activation offloading's host copies,
# MEM nodes with is_cpu_op) and says so once a rank; the cycle counts stand (the replay reproduces them exactly)
_BENIGN_CRITICAL = re.compile(r"Only GPU and COMM types are supported for overlap extraction")
KEPT_LINES = 8  # [critical] and malformed lines kept for the message
KEYWORDS = (b"critical", b"[C]", b"Exiting", b"finished")  # a line without one of these cannot change the verdict


_KEY_TEXT = tuple(k.decode() for k in KEYWORDS)


class AstraSimNotFound(SimulatorError):
    """No binary given, or the given path is missing or not executable."""


class AstraSimCrashed(SimulatorError):
    """The process exited non-zero (other than the known exit fault)."""


class AstraSimKnownExitFault(SimulatorError):
    """The known exit-134 teardown abort, with some ranks' results lost (or not accepted).

    ``lost``: what was lost (a phrase), when that is why; empty when the
    complete result was only refused.
    """

    def __init__(self, message: str, lost: str = "") -> None:
        super().__init__(message)
        self.lost = lost


class AstraSimTimeout(SimulatorError):
    """The run exceeded its time limit; its processes were killed."""


class AstraSimOutputError(SimulatorError):
    """Output that cannot be trusted: malformed, incomplete, with a [critical] line, or impossible."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AstraSimResult:
    """Per-rank finish time and exposed communication, in cycles (1 cycle = 1 ns).

    ``known_exit_fault``: the run that gave these numbers ended in ASTRA-sim
    518bd51's exit-134 teardown abort after every rank had finished;
    ``attempts``: runs it took (a run that lost lines to that fault is rerun).
    """

    per_rank_cycles: tuple[int, ...]
    per_rank_exposed_comm: tuple[int, ...]
    exit_code: int = 0
    known_exit_fault: bool = False
    attempts: int = 1
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
    lines: int = 0


class LogScanner:
    """Feed lines one at a time; :meth:`scan` says what was seen. Memory: one entry per rank.

    A line that mentions a rank finishing but does not match the format, a rank
    reported twice, or exposed communication above the rank's total time is
    recorded as malformed.
    """

    def __init__(self) -> None:
        self.finished: dict[int, tuple[int, int]] = {}
        self.exiting = False
        self.critical: list[str] = []
        self.malformed: list[str] = []
        self.lines = 0

    def _keep(self, bucket: list[str], text: str) -> None:
        if len(bucket) < KEPT_LINES:
            bucket.append(text)

    def feed(self, line: str, number: int | None = None) -> None:
        """Read one line; ``number`` is its line number when lines were skipped (see KEYWORDS)."""
        self.lines = self.lines + 1 if number is None else number
        number = self.lines
        if not any(k in line for k in _KEY_TEXT):
            return  # the common line (statistics) costs four substring tests
        if _CRITICAL.search(line):
            if not _BENIGN_CRITICAL.search(line):
                self._keep(self.critical, f"line {number}: {line.strip()[:200]}")
            return
        if _EXITING.search(line):
            self.exiting = True
            return
        match = _FINISHED.search(line)
        if match:
            rank, cycles, exposed = (int(g) for g in match.groups())
            if rank in self.finished:
                self._keep(self.malformed, f"line {number}: rank {rank} reported twice")
            elif exposed > cycles:
                self._keep(self.malformed, f"line {number}: rank {rank} exposed communication {exposed} > "
                                           f"total {cycles}")
            else:
                self.finished[rank] = (cycles, exposed)
        elif _FINISHED_HINT.search(line):
            self._keep(self.malformed, f"line {number}: unrecognised 'finished' line {line.strip()[:120]!r}")

    def scan(self) -> LogScan:
        return LogScan(finished=dict(self.finished), exiting=self.exiting, critical=tuple(self.critical),
                       malformed=tuple(self.malformed), lines=self.lines)


def scan_log(text: str) -> LogScan:
    """Collect ``finished`` lines, ``[critical]`` lines and the ``Exiting`` line of a whole output."""
    scanner = LogScanner()
    for line in text.splitlines():
        scanner.feed(line)
    return scanner.scan()


def missing_ranks(scan: LogScan, n_ranks: int) -> list[int]:
    return [r for r in range(n_ranks) if r not in scan.finished]


def describe_ranks(ranks: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def check_scan(scan: LogScan, n_ranks: int, *, need_exiting: bool) -> None:
    """Raise AstraSimOutputError unless ``scan`` is a complete, clean, possible run of ``n_ranks``."""
    if scan.critical:
        raise AstraSimOutputError(f"ASTRA-sim printed a [critical] line ({scan.critical[0]}); "
                                  f"fix the input it names and rerun")
    if scan.malformed:
        raise AstraSimOutputError(f"ASTRA-sim output not understood ({scan.malformed[0]}); "
                                  f"check the binary version (expected commit 518bd51 format)")
    extra = sorted(r for r in scan.finished if not 0 <= r < n_ranks)
    if extra:
        raise AstraSimOutputError(f"ASTRA-sim reported rank(s) {describe_ranks(extra)} but the run has "
                                  f"{n_ranks} ranks; check that n_ranks matches the network config")
    missing = missing_ranks(scan, n_ranks)
    if missing:
        raise AstraSimOutputError(f"ASTRA-sim output lacks the 'finished' line of {len(missing)} of {n_ranks} "
                                  f"rank(s) ({describe_ranks(missing)}); the run is incomplete, rerun it")
    if max(c for c, _ in scan.finished.values()) <= 0:
        raise AstraSimOutputError("ASTRA-sim reported a step time of 0 cycles, which no training iteration "
                                  "takes; check that the traces hold the workload")
    if need_exiting and not scan.exiting:
        raise AstraSimOutputError("ASTRA-sim output has no final 'Exiting' line; the run did not end "
                                  "cleanly, rerun it and check its stderr")


def result_of(scan: LogScan, n_ranks: int, **extra: object) -> AstraSimResult:
    cycles = tuple(scan.finished[r][0] for r in range(n_ranks))
    exposed = tuple(scan.finished[r][1] for r in range(n_ranks))
    return AstraSimResult(per_rank_cycles=cycles, per_rank_exposed_comm=exposed, **extra)  # type: ignore[arg-type]


def parse_astra_sim_output(text: str, n_ranks: int) -> AstraSimResult:
    """Parse the stdout of a successful run: every rank once, no [critical], an Exiting line."""
    if n_ranks < 1:
        raise ConfigError(f"n_ranks={n_ranks} must be >= 1")
    scan = scan_log(text)
    check_scan(scan, n_ranks, need_exiting=True)
    return result_of(scan, n_ranks)
