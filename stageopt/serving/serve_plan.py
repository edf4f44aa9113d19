"""Serving plans: how a model is deployed on GPUs to answer requests.

A deployment is one pool of identical engine instances that both prefill and
decode (colocated, as vLLM/SGLang/TensorRT-LLM run by default), or a prefill
pool and a decode pool (disaggregated, as in Splitwise and DistServe) with each
request's KV cache moved from one to the other. An instance is ``tp x pp``
GPUs; ``ep`` splits the experts of an MoE layer over ``ep`` of the ``tp`` ranks
(the rest split each expert); ``dpa`` (data-parallel attention) runs attention
with each of the ``tp`` ranks serving its own requests, the way SGLang and
vLLM serve MLA models whose single latent KV head cannot be split by TP.
``max_seqs`` caps the sequences in a step (vLLM ``max_num_seqs``),
``max_tokens`` the new tokens in a step (``max_num_batched_tokens``; with
chunked prefill, a long prompt is cut to fit it).

String form (``stageopt serve --plan``): ``"tp=8 x=2 max_seqs=256 max_tokens=8192"``
for colocated, ``"prefill: tp=8 x=1 max_tokens=16384 | decode: tp=8 x=3 max_seqs=512"``
for disaggregated; ``wdtype=fp8``, ``kvdtype=fp8``, ``link=nvlink|scaleout`` apply to the
whole deployment and may sit in either part, as does ``gpu_mem`` (the share of HBM
the engine may fill with weights, workspace and KV cache: vLLM's
``gpu_memory_utilization``, default 0.9) and ``sched`` (``vllm``: admit on the
prompt's pages, preempt when the cache runs out; ``noevict``: TensorRT-LLM's
default, admit only when the whole request's pages fit).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass

from stageopt.errors import InfeasiblePlan

DTYPES = {"bf16": 2, "fp16": 2, "fp8": 1}
LINKS = ("auto", "nvlink", "scaleout")
POOL_KEYS = ("tp", "pp", "ep", "x", "dpa", "max_seqs", "max_tokens")
GLOBAL_KEYS = ("wdtype", "kvdtype", "link", "gpu_mem", "sched")
SCHEDULERS = ("vllm", "noevict")


@dataclass(frozen=True, kw_only=True, slots=True)
class Pool:
    """``instances`` engine instances of ``tp x pp`` GPUs each, with their batching caps."""

    role: str = "both"  # both | prefill | decode
    tp: int = 1
    pp: int = 1
    ep: int = 1
    instances: int = 1
    dpa: bool = False
    max_seqs: int = 256
    max_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "instances", "max_seqs", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InfeasiblePlan(f"serving plan field '{name}' must be a positive integer, got {value!r}")
        if self.tp % self.ep:
            raise InfeasiblePlan(f"serving plan: ep={self.ep} must divide tp={self.tp} (experts are split over "
                                 f"ep of an instance's tp ranks); set ep to a divisor of tp")
        if self.role not in ("both", "prefill", "decode"):
            raise InfeasiblePlan(f"serving pool role {self.role!r} unknown; use both, prefill or decode")

    @property
    def gpus_per_instance(self) -> int:
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.gpus_per_instance * self.instances

    def describe(self) -> str:
        extra = (f" ep={self.ep}" if self.ep > 1 else "") + (" dpa=on" if self.dpa else "")
        caps = f"max_seqs={self.max_seqs} " if self.role != "prefill" else ""
        return f"tp={self.tp} pp={self.pp}{extra} x={self.instances} {caps}max_tokens={self.max_tokens}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ServePlan:
    """A colocated pool, or a prefill pool and a decode pool; weight and KV-cache dtypes."""

    pools: tuple[Pool, ...]
    wdtype: str = "bf16"
    kvdtype: str = "bf16"
    link: str = "auto"
    gpu_mem: float = 0.9
    sched: str = "vllm"

    def __post_init__(self) -> None:
        if self.sched not in SCHEDULERS:
            raise InfeasiblePlan(f"serving plan field 'sched' must be one of {', '.join(SCHEDULERS)}, got {self.sched!r}")
        if isinstance(self.gpu_mem, bool) or not isinstance(self.gpu_mem, (int, float)) or not 0.1 <= self.gpu_mem <= 1:
            raise InfeasiblePlan(f"serving plan field 'gpu_mem' must be a fraction of HBM in [0.1, 1], got {self.gpu_mem!r}")
        roles = tuple(p.role for p in self.pools)
        if roles not in (("both",), ("prefill", "decode")):
            raise InfeasiblePlan(f"serving plan: pools {roles} are neither one colocated pool nor "
                                 f"'prefill: ... | decode: ...'")
        for name, value in (("wdtype", self.wdtype), ("kvdtype", self.kvdtype)):
            if value not in DTYPES:
                raise InfeasiblePlan(f"serving plan field '{name}' must be one of {', '.join(DTYPES)}, got {value!r}")
        if self.link not in LINKS:
            raise InfeasiblePlan(f"serving plan field 'link' must be one of {', '.join(LINKS)}, got {self.link!r}")

    @property
    def disaggregated(self) -> bool:
        return len(self.pools) == 2

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    def pool(self, role: str) -> Pool:
        """The pool that does ``role`` (prefill or decode); the colocated pool does both."""
        for p in self.pools:
            if p.role in (role, "both"):
                return p
        raise KeyError(role)

    def describe(self) -> str:
        tail = "".join(f" {k}={getattr(self, k)}" for k, d in (("wdtype", "bf16"), ("kvdtype", "bf16"),
                                                                 ("link", "auto"), ("gpu_mem", 0.9),
                                                                 ("sched", "vllm"))
                       if getattr(self, k) != d)
        if not self.disaggregated:
            return self.pools[0].describe() + tail
        return f"prefill: {self.pools[0].describe()} | decode: {self.pools[1].describe()}{tail}"

    @staticmethod
    def parse(text: str) -> "ServePlan":
        """Read the string form (see the module docstring); errors name the bad item."""
        parts = [p.strip() for p in text.split("|")]
        if len(parts) > 2:
            raise InfeasiblePlan(f"serving plan {text!r}: at most two parts ('prefill: ... | decode: ...')")
        glob: dict[str, str] = {}
        pools = []
        for part in parts:
            role = "both"
            head, sep, rest = part.partition(":")
            if sep and head.strip() in ("prefill", "decode"):
                role, part = head.strip(), rest
            elif len(parts) == 2:
                raise InfeasiblePlan(f"serving plan part {part!r}: start it with 'prefill:' or 'decode:'")
            pools.append(_parse_pool(part, role, glob))
        if len(pools) == 2 and pools[0].role == "decode":
            pools.reverse()
        if "gpu_mem" in glob:
            try:
                glob["gpu_mem"] = float(glob["gpu_mem"])  # type: ignore[assignment]
            except ValueError:
                raise InfeasiblePlan(f"serving plan: gpu_mem={glob['gpu_mem']!r} must be a number") from None
        return ServePlan(pools=tuple(pools), **glob)  # type: ignore[arg-type]


def _parse_pool(text: str, role: str, glob: dict[str, str]) -> Pool:
    fields: dict[str, object] = {"role": role}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise InfeasiblePlan(f"serving plan item {item!r} is not key=value; e.g. tp=8")
        if key in GLOBAL_KEYS:
            glob[key] = value
            continue
        if key not in POOL_KEYS:
            close = difflib.get_close_matches(key, POOL_KEYS + GLOBAL_KEYS, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(POOL_KEYS + GLOBAL_KEYS)}"
            raise InfeasiblePlan(f"serving plan key {key!r} unknown; {hint}")
        if key == "dpa":
            if value not in ("on", "off"):
                raise InfeasiblePlan(f"serving plan: dpa={value!r} must be on or off")
            fields["dpa"] = value == "on"
            continue
        try:
            fields["instances" if key == "x" else key] = int(value)
        except ValueError:
            raise InfeasiblePlan(f"serving plan: {key}={value!r} must be an integer") from None
    return Pool(**fields)  # type: ignore[arg-type]


def with_pool(plan: ServePlan, index: int, **changes: object) -> ServePlan:
    """A copy of ``plan`` with pool ``index`` changed."""
    pools = list(plan.pools)
    pools[index] = dataclasses.replace(pools[index], **changes)
    return dataclasses.replace(plan, pools=tuple(pools))
