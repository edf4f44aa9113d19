"""The study is the cache: results by candidate key, read from every worker's trials, and claims on plans.

Why in the study and not in a file or in memory: any number of workers may
search one study. Before a worker simulates a plan it *claims* it, under the
storage's claim lock (:class:`~stageopt.search.storage.StudyStorage`): it reads
what every worker has told or claimed, and writes the plan's ``key`` on its own
running trial only if nobody holds it. So no plan is simulated twice, the budget
counts the study's simulations (not one process's), and ``--resume`` starts from
exactly what was told. A claim dies with its trial: a trial failed because its
worker died (Optuna's stale-trial check) releases its plan to the others.

How a told trial is encoded (what every Optuna tool reads):

* a feasible result: COMPLETE, with its objective values;
* over memory or an invalid plan: PRUNED (no values, so no "best trial" can be
  one), with its constraint values (``memory_gib`` over HBM, ``valid``) kept for
  the samplers, which read constraints from PRUNED trials too;
* a plan another trial already holds: PRUNED, ``status=repeat``, ``repeat_of``;
* a simulator crash or timeout: FAIL with its ``reason``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, ContextManager

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from stageopt.search.objective import FAILED, INVALID, OK, REPEAT, Objective, Outcome, outcome_from_attrs, record_attrs

KEY_ATTR = "key"
OLD_RESULT_ATTR = "result"  # stageopt 0.2 kept the whole record in one attribute


def trial_outcome(t: FrozenTrial) -> Outcome | None:
    """The result a stored trial holds (new flat attributes, or a 0.2 ``result`` blob), if any."""
    old = t.user_attrs.get(OLD_RESULT_ATTR)
    if isinstance(old, dict) and "key" in old and "status" in old:
        return Outcome(old["status"], {k: v for k, v in old.items() if k not in ("status", "simulated", "cached")})
    return outcome_from_attrs(t.user_attrs)


def _simulated(t: FrozenTrial) -> bool:
    old = t.user_attrs.get(OLD_RESULT_ATTR)
    return bool(old.get("simulated")) if isinstance(old, dict) else bool(t.user_attrs.get("simulated"))


def simulated_key(t: FrozenTrial) -> str | None:
    """The plan key a finished trial spent a simulation on, as the budget counts it (None: it did not).

    A trial failed as stale may hold the result its dead worker recorded before Optuna's tell; that
    result was never told, so it does not count (its plan is free to be simulated again). A simulator
    crash told as FAILED does count.
    """
    outcome = trial_outcome(t)
    if outcome is None or outcome.status == INVALID or not _simulated(t):
        return None
    if t.state == TrialState.FAIL and outcome.status != FAILED:
        return None
    return outcome.key


class StudyCache:
    """Outcomes by key, the keys that cost a simulation, and live claims, as the study holds them."""

    def __init__(self, study: optuna.Study, claim_lock: ContextManager[Any] | None = None) -> None:
        self.study = study
        self._lock = claim_lock if claim_lock is not None else contextlib.nullcontext()
        self._outcomes: dict[str, Outcome] = {}
        self.holder: dict[str, int] = {}  # key -> number of the trial that holds its result
        self.simulated: set[str] = set()
        self.claims: dict[str, int] = {}  # key -> number of a RUNNING trial simulating it
        self._failed_now: set[str] = set()  # failed in this session: not retried before the next one
        self._seen = 0
        self._open: set[int] = set()
        self.refresh()
        self._session_start = self._seen

    # ------------------------------------------------------------------ reading

    def __contains__(self, key: str) -> bool:
        return key in self._outcomes

    def __len__(self) -> int:
        return len(self._outcomes)

    def get(self, key: str) -> Outcome:
        return self._outcomes[key]

    def outcomes(self) -> list[Outcome]:
        return list(self._outcomes.values())

    @property
    def committed(self) -> int:
        """Simulations done or under way, by any worker (what the budget is measured against)."""
        return len(self.simulated | self.claims.keys())

    def taken(self, key: str) -> int | None:
        """Number of the trial that holds or is simulating ``key``; None if it is free."""
        if key in self.holder:
            return self.holder[key]
        if key in self.claims:
            return self.claims[key]
        return -1 if key in self._failed_now else None

    def refresh(self) -> None:
        """Read trials told or claimed since the last look (every worker's)."""
        trials = self.study.get_trials(deepcopy=False)
        for number in sorted(self._open) + list(range(self._seen, len(trials))):
            self._read(trials[number])
        self._seen = len(trials)

    def _read(self, t: FrozenTrial) -> None:
        key = t.user_attrs.get(KEY_ATTR)
        if t.state in (TrialState.RUNNING, TrialState.WAITING):
            self._open.add(t.number)
            if isinstance(key, str) and key not in self.holder and t.user_attrs.get("status") not in (REPEAT, INVALID):
                self.claims.setdefault(key, t.number)
            return
        self._open.discard(t.number)
        if isinstance(key, str) and self.claims.get(key) == t.number:
            del self.claims[key]
        outcome = trial_outcome(t)
        if outcome is None or outcome.status == INVALID:
            return
        if t.state == TrialState.FAIL or outcome.status == FAILED:  # a stale trial may hold half its attributes
            if outcome.status == FAILED and _simulated(t):
                self.simulated.add(outcome.key)
                if t.number >= getattr(self, "_session_start", 1 << 62):
                    self._failed_now.add(outcome.key)
            return
        self._outcomes.setdefault(outcome.key, outcome)
        self.holder.setdefault(outcome.key, t.number)
        self.claims.pop(outcome.key, None)
        if _simulated(t):
            self.simulated.add(outcome.key)

    # ------------------------------------------------------------------ claiming

    def claim(self, items: list[tuple[optuna.trial.Trial, str, bool]], target: int) -> list[int | None | str]:
        """Claim each ``(trial, key, costs_a_simulation)`` under the study's claim lock.

        Returns per item: ``None`` (claimed: evaluate it), the number of the trial
        that already holds the key (tell a repeat), or ``"budget"`` (the study's
        budget is used up by other workers' claims; do not evaluate).
        """
        out: list[int | None | str] = []
        with self._lock:
            self.refresh()
            for trial, key, costly in items:
                holder = self.taken(key)
                if holder is not None:
                    out.append(holder)
                    continue
                if costly and self.committed >= target:
                    out.append("budget")
                    continue
                trial.set_user_attr(KEY_ATTR, key)
                self.claims[key] = trial.number
                out.append(None)
        return out

    def claim_new(self, items: list[tuple[str, Callable[[], optuna.trial.Trial]]],
                  target: int) -> list[optuna.trial.Trial | None]:
        """Open and claim a trial for each ``(key, open_trial)`` whose plan nobody holds or claims.

        For plans chosen without the sampler (census-guided confirmation): the
        trial is opened only once the plan is known to be free, so a plan taken by
        another worker leaves no repeat behind. ``None``: taken, or the study's
        budget is used up.
        """
        out: list[optuna.trial.Trial | None] = []
        with self._lock:
            self.refresh()
            for key, open_trial in items:
                if self.taken(key) is not None or self.committed >= target:
                    out.append(None)
                    continue
                trial = open_trial()
                trial.set_user_attr(KEY_ATTR, key)
                self.claims[key] = trial.number
                out.append(trial)
        return out

    def add_finished(self, items: list[tuple[str, FrozenTrial]]) -> int:
        """Add finished trials (census answers) for plans the study does not hold yet; returns how many.

        Under the claim lock, so two workers recording the same census add each plan once.
        """
        with self._lock:
            self.refresh()
            fresh = {key: t for key, t in items if self.taken(key) is None}
            if fresh:
                self.study.add_trials(list(fresh.values()))
            self.refresh()
        return len(fresh)

    def put(self, outcome: Outcome, number: int, *, simulated: bool) -> None:
        """What this worker just told (so it need not wait for the next refresh)."""
        key = outcome.key
        if self.claims.get(key) == number:
            del self.claims[key]
        if simulated:
            self.simulated.add(key)
        if outcome.status == FAILED:
            self._failed_now.add(key)
            return
        self._outcomes.setdefault(key, outcome)
        self.holder.setdefault(key, number)

    def simulated_ok(self) -> int:
        return sum(1 for k in self.simulated if k in self._outcomes and self._outcomes[k].status == OK)


# ----------------------------------------------------------------------------- telling


def told_form(outcome: Outcome, objectives: tuple[Objective, ...]) -> tuple[TrialState, list[float] | None,
                                                                            dict[str, float]]:
    """The state, objective values and constraints a result is told with (the encoding above)."""
    if outcome.status == OK:
        return TrialState.COMPLETE, outcome.values(objectives), outcome.constraints()
    if outcome.status == FAILED:
        return TrialState.FAIL, None, {}
    return TrialState.PRUNED, None, outcome.constraints()


def finished_trial(params: Mapping[str, Any], distributions: Mapping[str, optuna.distributions.BaseDistribution],
                   outcome: Outcome, objectives: tuple[Objective, ...], *, simulated: bool) -> FrozenTrial:
    """A finished trial holding ``outcome`` exactly as :func:`tell_outcome` would have told it."""
    state, values, constraints = told_form(outcome, objectives)
    return optuna.trial.create_trial(state=state, values=values, params=dict(params),
                                     distributions=dict(distributions),
                                     user_attrs=record_attrs(outcome, simulated=simulated), constraints=constraints)


def tell_outcome(study: optuna.Study, trial: optuna.trial.Trial, outcome: Outcome,
                 objectives: tuple[Objective, ...], *, simulated: bool) -> TrialState:
    """Tell a trial its result with the encoding above; returns the state it got."""
    attrs = record_attrs(outcome, simulated=simulated)
    state, values, constraints = told_form(outcome, objectives)
    try:
        _write(trial, attrs, constraints)
        study.tell(trial, values, state=state)
    except UpdateFinishedTrialError:
        if outcome.status != FAILED:  # failed as stale by another worker while we simulated: keep the result
            _readd(study, trial._trial_id, attrs, constraints, values, state)
    return state


def tell_repeat(study: optuna.Study, trial: optuna.trial.Trial, key: str, holder: int,
                constraints: Mapping[str, float] | None) -> None:
    """A proposal of a plan the study already holds: PRUNED, pointing at the trial that holds it."""
    attrs: dict[str, Any] = {"status": REPEAT, KEY_ATTR: key}
    if holder >= 0:
        attrs["repeat_of"] = holder
    with contextlib.suppress(UpdateFinishedTrialError):
        _write(trial, attrs, constraints or {})
        study.tell(trial, state=TrialState.PRUNED)


def tell_unevaluated(study: optuna.Study, trial: optuna.trial.Trial, reason: str) -> None:
    """A trial asked but not evaluated (the study's budget was reached by other workers): FAIL with why."""
    with contextlib.suppress(UpdateFinishedTrialError):
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=TrialState.FAIL)


def _write(trial: optuna.trial.Trial, attrs: Mapping[str, Any], constraints: Mapping[str, float]) -> None:
    """Attributes and constraints of a running trial: in one transaction where the storage can (databases)."""
    backend = getattr(trial.storage, "_backend", trial.storage)  # under Optuna's cache of an RDB storage
    if hasattr(backend, "set_trial_attrs"):
        backend.set_trial_attrs(trial._trial_id, attrs, {f"constraints:{k}": float(v) for k, v in constraints.items()})
        return
    for name, value in attrs.items():
        trial.set_user_attr(name, value)
    for name, value in constraints.items():
        trial.set_constraint(name, value)


def _readd(study: optuna.Study, trial_id: int, attrs: Mapping[str, Any], constraints: Mapping[str, float],
           values: list[float] | None, state: TrialState) -> None:
    old = study._storage.get_trial(trial_id)
    study.add_trial(optuna.trial.create_trial(
        state=state, values=values, params=old.params, distributions=old.distributions,
        user_attrs={**old.user_attrs, **attrs, "retold_from": old.number},
        system_attrs={f"constraints:{k}": float(v) for k, v in constraints.items()}))
