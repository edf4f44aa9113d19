"""One engine's scheduler: continuous batching with chunked prefill over a paged KV cache.

The policy is vLLM's (V1 scheduler, which SGLang and TensorRT-LLM's in-flight
batching resemble): every step first serves the running requests in admission
order -- one token for each decoding request, the next prompt chunk for a
request still in prefill -- then admits waiting requests first come first
served, while the step has fewer than ``max_seqs`` sequences and fewer than
``max_tokens`` new tokens, cutting the last prompt to fit (chunked prefill).
KV-cache pages (``PAGE_TOKENS`` tokens) are taken as a request's context
grows; when a running request needs a page and none is free, the most recently
admitted request is preempted: its pages are freed and it goes back to the
front of the queue, to recompute its prompt and what it generated (vLLM's
default recompute preemption).

``sched=noevict`` is TensorRT-LLM's default capacity policy instead
(GUARANTEED_NO_EVICT): a request is admitted only when pages for its whole
prompt and output are free, and keeps them, so nothing is ever preempted.

Roles: ``both`` (colocated), ``prefill`` (a request leaves after its first
token, for a decode pool) and ``decode`` (requests arrive with their prompt
already in cache, transferred from a prefill pool).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from stageopt.serving.kv_memory import PAGE_TOKENS


@dataclass(eq=False)
class Request:
    rid: int
    arrival: float
    prompt: int
    output: int
    computed: int = 0  # tokens of context in this engine's cache (prompt chunks done + generated)
    generated: int = 0
    pages: int = 0
    first_token: float = math.nan
    finish: float = math.nan
    preempted: int = 0

    @property
    def target(self) -> int:
        """Context the cache must hold before the next token is sampled (all of it again after a preemption)."""
        return self.prompt + self.generated


@dataclass
class StepPlan:
    """What one step runs: (request, new tokens) pairs, and its totals for the step timer."""

    work: list[tuple[Request, int]] = field(default_factory=list)
    tokens: int = 0
    pairs: float = 0.0
    keys: float = 0.0
    sampled: int = 0


class Engine:
    """Scheduler state of one engine (one virtual engine of an instance when pp > 1)."""

    def __init__(self, name: str, role: str, kv_tokens: int, max_seqs: int, max_tokens: int,
                 sched: str = "vllm") -> None:
        self.name, self.role = name, role
        self.reserve = sched == "noevict"
        self.free_pages = kv_tokens // PAGE_TOKENS
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.busy = False

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def can_ever_fit(self, req: Request) -> bool:
        return math.ceil((req.prompt + req.output) / PAGE_TOKENS) <= self.free_pages + sum(r.pages for r in self.running)

    def _grow(self, req: Request, new_tokens: int) -> bool:
        need = math.ceil((req.computed + new_tokens) / PAGE_TOKENS) - req.pages
        if need > self.free_pages:
            return False
        self.free_pages -= max(need, 0)
        req.pages += max(need, 0)
        return True

    def _release(self, req: Request) -> None:
        self.free_pages += req.pages
        req.pages = 0

    def _preempt_last(self) -> None:
        victim = self.running.pop()
        self._release(victim)
        victim.computed = 0
        victim.preempted += 1
        self.waiting.appendleft(victim)

    def plan_step(self) -> StepPlan | None:
        """Choose the work of the next step (taking pages); None when there is nothing to run.

        The hot loop of a simulation: page arithmetic is inlined on locals
        (the same as :meth:`_grow`), which keeps a 2,000-sequence step cheap.
        """
        plan = StepPlan()
        work = plan.work
        budget = self.max_tokens
        running = self.running
        tokens = sampled = 0
        pairs = keys = 0.0
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            prefix = req.computed
            target = req.prompt + req.generated
            n = min(target - prefix, budget)
            need = -(-(prefix + n) // PAGE_TOKENS) - req.pages
            if need > self.free_pages:
                last = running[-1] is req
                self._preempt_last()
                if last:
                    break
                continue
            if need > 0:
                self.free_pages -= need
                req.pages += need
            work.append((req, n))
            tokens += n
            pairs += n * prefix + n * (n + 1) / 2
            keys += prefix + n
            sampled += prefix + n >= target
            budget -= n
            i += 1
        plan.tokens, plan.pairs, plan.keys, plan.sampled = tokens, pairs, keys, sampled
        while self.waiting and len(running) < self.max_seqs and budget > 0:
            req = self.waiting[0]
            n = min(req.target - req.computed, budget)
            whole = req.prompt + req.output - req.computed  # noevict: pages for every token it will hold
            if not self._grow(req, max(whole, n) if self.reserve else n):
                break
            self.waiting.popleft()
            running.append(req)
            self._add(plan, req, n)
            budget -= n
        return plan if work else None

    @staticmethod
    def _add(plan: StepPlan, req: Request, n: int) -> None:
        prefix = req.computed
        plan.work.append((req, n))
        plan.tokens += n
        plan.pairs += n * prefix + n * (n + 1) / 2
        plan.keys += prefix + n
        if prefix + n >= req.target:
            plan.sampled += 1

    def finish_step(self, plan: StepPlan, now: float) -> tuple[list[Request], list[Request]]:
        """Apply a finished step at time ``now``; returns (requests done here, requests handed to decode)."""
        done, handed = [], []
        leaving = set()
        for req, n in plan.work:
            req.computed += n
            if req.computed < req.prompt + req.generated:
                continue
            req.generated += 1
            if req.generated == 1:
                req.first_token = now
            if self.role == "prefill" or req.generated >= req.output:
                leaving.add(id(req))
                self._release(req)
                if req.generated >= req.output:
                    req.finish = now
                    done.append(req)
                else:
                    handed.append(req)
        if leaving:
            self.running = [r for r in self.running if id(r) not in leaving]
        return done, handed
