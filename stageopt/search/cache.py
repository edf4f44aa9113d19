"""Results by canonical candidate key, so that a repeated proposal costs no simulation.

Why rebuilt from storage rather than saved apart: the study is the one durable
record; ``--resume`` reads every finished trial's stored ``result`` and the
cache is exactly what was told before (a second file could disagree with it).
"""

from __future__ import annotations

from collections.abc import Iterable

import optuna

from stageopt.search.objective import FAILED, OK, Outcome

RESULT_ATTR = "result"


STORED_ONLY = ("status", "simulated", "cached")


def stored_result(outcome: Outcome, *, simulated: bool, cached: bool) -> dict:
    """What a told trial keeps as its ``result`` user attribute (one storage write)."""
    return {**outcome.record, "status": outcome.status, "simulated": simulated, "cached": cached}


class ResultCache:
    """Outcomes by key, and the set of keys that cost a simulation on the backend."""

    def __init__(self) -> None:
        self._outcomes: dict[str, Outcome] = {}
        self.simulated: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._outcomes

    def __len__(self) -> int:
        return len(self._outcomes)

    def get(self, key: str) -> Outcome:
        return self._outcomes[key]

    def put(self, outcome: Outcome, simulated: bool) -> None:
        self._outcomes[outcome.key] = outcome
        if simulated:
            self.simulated.add(outcome.key)

    def outcomes(self) -> list[Outcome]:
        return list(self._outcomes.values())

    @classmethod
    def from_trials(cls, trials: Iterable[optuna.trial.FrozenTrial]) -> "ResultCache":
        """Rebuild from stored trials: every finished trial with a result (failed ones are retried)."""
        cache = cls()
        for t in trials:
            stored = t.user_attrs.get(RESULT_ATTR)
            if not isinstance(stored, dict) or "key" not in stored or "status" not in stored:
                continue
            record = {k: v for k, v in stored.items() if k not in STORED_ONLY}
            if t.state == optuna.trial.TrialState.COMPLETE and stored["status"] != FAILED:
                cache.put(Outcome(stored["status"], record), simulated=bool(stored.get("simulated")))
            elif stored["status"] == FAILED and stored.get("simulated"):
                cache.simulated.add(record["key"])
        return cache

    def simulated_ok(self) -> int:
        return sum(1 for k in self.simulated if k in self._outcomes and self._outcomes[k].status == OK)
