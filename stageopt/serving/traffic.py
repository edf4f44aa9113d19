"""Traffic and service-level objectives: what a deployment is asked to serve, and how fast.

Traffic is an open arrival process (Poisson at ``rate`` requests/s), a closed
loop of ``concurrency`` clients that each send the next request when the last
one finishes (how genai-perf, vLLM's ``--max-concurrency`` and NIM's tables
measure), or every request at once (``rate=inf``: offline throughput, as
TensorRT-LLM's throughput tables). Input and output lengths are fixed or drawn
from a distribution. String form (``stageopt serve --traffic``)::

    rate=4 input=1024 output=256 requests=2000
    concurrency=64 input=normal:2048:512 output=uniform:64:512
    rate=inf input=lognormal:1500:0.8 output=fixed:300

Distributions: ``fixed:N`` (or just ``N``), ``uniform:LO:HI``, ``normal:MEAN:STD``,
``lognormal:MEAN:SIGMA`` (SIGMA of the log; MEAN is the distribution's mean),
``exponential:MEAN``; draws are rounded and clipped to at least 1 token.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

import numpy as np

from stageopt.errors import ConfigError

KINDS = ("fixed", "uniform", "normal", "lognormal", "exponential")
TRAFFIC_KEYS = ("rate", "concurrency", "input", "output", "requests", "seed")
SLO_KEYS = ("ttft_ms", "tpot_ms", "percentile")


@dataclass(frozen=True, kw_only=True, slots=True)
class Lengths:
    """A token-length distribution."""

    kind: str = "fixed"
    a: float = 1.0
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"length distribution {self.kind!r} unknown; use one of {', '.join(KINDS)}")
        if self.a <= 0 or self.b < 0 or (self.kind == "uniform" and self.b < self.a):
            raise ConfigError(f"length distribution {self.describe()}: parameters must be positive "
                              f"(uniform needs LO <= HI)")

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            x = np.full(n, self.a)
        elif self.kind == "uniform":
            x = rng.uniform(self.a, self.b, n)
        elif self.kind == "normal":
            x = rng.normal(self.a, self.b, n)
        elif self.kind == "lognormal":
            x = rng.lognormal(math.log(self.a) - self.b ** 2 / 2, self.b, n)
        else:
            x = rng.exponential(self.a, n)
        return np.maximum(np.rint(x), 1).astype(np.int64)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g}"
        return f"{self.kind}:{self.a:g}" + (f":{self.b:g}" if self.kind != "exponential" else "")

    @staticmethod
    def parse(text: str, where: str) -> "Lengths":
        kind, _, rest = str(text).partition(":")
        if not rest:
            kind, rest = "fixed", str(text)
        try:
            nums = [float(v) for v in rest.split(":")]
        except ValueError:
            raise ConfigError(f"{where}: {text!r} is not a length; write N or kind:A[:B], e.g. normal:1024:256") from None
        want = {"fixed": 1, "exponential": 1}.get(kind, 2)
        if len(nums) != want:
            raise ConfigError(f"{where}: {kind} takes {want} number(s), got {text!r}")
        return Lengths(kind=kind, a=nums[0], b=nums[1] if want == 2 else 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Traffic:
    """Requests offered to a deployment."""

    rate: float | None = None  # requests/s (Poisson); inf: all at once
    concurrency: int | None = None  # closed loop of clients
    input: Lengths = Lengths(a=1024)
    output: Lengths = Lengths(a=256)
    requests: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ConfigError("traffic: give exactly one of rate=R (requests/s, or inf) and concurrency=N")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError(f"traffic: rate={self.rate} must be positive (or inf for offline throughput)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"traffic: concurrency={self.concurrency} must be at least 1")
        if self.requests < 1:
            raise ConfigError(f"traffic: requests={self.requests} must be at least 1")

    @property
    def offline(self) -> bool:
        return self.rate is not None and math.isinf(self.rate)

    def describe(self) -> str:
        load = f"concurrency={self.concurrency}" if self.concurrency else f"rate={self.rate:g}"
        return f"{load} input={self.input.describe()} output={self.output.describe()} requests={self.requests}"

    @staticmethod
    def parse(text: str, where: str = "--traffic") -> "Traffic":
        fields: dict[str, object] = {}
        for item in text.split():
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"{where}: {item!r} is not key=value; e.g. rate=4")
            fields[key] = value
        return traffic_from_dict(fields, where)


def traffic_from_dict(data: dict, where: str) -> Traffic:
    for key in data:
        if key not in TRAFFIC_KEYS:
            close = difflib.get_close_matches(str(key), TRAFFIC_KEYS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(TRAFFIC_KEYS)}"
            raise ConfigError(f"{where}: unknown key {key!r}; {hint}")
    try:
        rate = float(data["rate"]) if "rate" in data else None
        conc = int(data["concurrency"]) if "concurrency" in data else None
        requests = int(data.get("requests", 1000))
        seed = int(data.get("seed", 0))
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: rate, concurrency, requests and seed must be numbers") from None
    return Traffic(rate=rate, concurrency=conc, requests=requests, seed=seed,
                   input=Lengths.parse(data.get("input", 1024), f"{where}: input"),
                   output=Lengths.parse(data.get("output", 256), f"{where}: output"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Slo:
    """Latency targets at a percentile of requests (None: no target)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: float = 90.0

    def __post_init__(self) -> None:
        if not 0 < self.percentile < 100:
            raise ConfigError(f"slo: percentile={self.percentile} must be between 0 and 100, e.g. 90 or 99")
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"slo: {name}={value} must be positive")

    def met(self, ttft_s: float, tpot_s: float) -> bool:
        ok_ttft = self.ttft_ms is None or ttft_s * 1e3 <= self.ttft_ms
        ok_tpot = self.tpot_ms is None or tpot_s * 1e3 <= self.tpot_ms
        return ok_ttft and ok_tpot


def slo_from_dict(data: dict, where: str) -> Slo:
    for key in data:
        if key not in SLO_KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; known: {', '.join(SLO_KEYS)}")
    try:
        return Slo(**{k: float(v) for k, v in data.items()})
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: ttft_ms, tpot_ms and percentile must be numbers") from None
