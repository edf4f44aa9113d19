"""Where the analytical model and an expensive backend disagree: a Bayesian linear model of the residual.

Why a residual and not the time itself: the analytical model already explains
almost all of the variation between plans (the replay agrees within 5%); what is
left, ``log(t_backend / t_analytical)``, depends smoothly on a few things the
closed form treats coarsely — how much of the iteration is pipeline bubble,
exposed TP/CP/EP/DP communication or point-to-point traffic, and the schedule.
A linear model over those shares and the plan's degrees, with Bayesian
uncertainty, is enough to say which unsimulated plan might be better than its
analytical rank says, and how sure that is. The prior and noise precisions are
fitted by evidence maximization (MacKay's fixed-point updates), within two floors:
a coefficient's prior standard deviation stays at least ``PRIOR_STD`` (5%, the
largest analytical-vs-replay disagreement measured in ``experiments/simulators/``),
so an effect never measured keeps that much uncertainty instead of collapsing to
zero when every residual seen so far is small; and the noise at least ``NOISE_STD``.
"""

from __future__ import annotations

import numpy as np

PRIOR_STD = 0.05
NOISE_STD = 0.001
SHARES = ("t_bubble", "t_tp", "t_cp", "t_ep", "t_dp", "t_p2p", "t_optimizer")


def plan_features(arrays: dict[str, np.ndarray], plans: list[dict]) -> np.ndarray:
    """One row per plan: time shares of the analytical breakdown, log2 degrees, and choice indicators."""
    t = np.maximum(arrays["iteration_time_s"], 1e-12)
    cols = [arrays[k] / t for k in SHARES]
    for name in ("tp", "pp", "cp", "ep", "vpp", "dp", "mbs"):
        cols.append(np.log2(np.array([p[name] for p in plans], dtype=float)))
    cols.append(np.log2(np.array([p["gbs"] / (p["mbs"] * p["dp"]) for p in plans], dtype=float)))
    for name, values in (("zero", (0, 1, 2, 3)), ("recompute", ("none", "selective", "full")),
                         ("schedule", ("1f1b", "interleaved", "gpipe"))):
        for value in values[1:]:
            cols.append(np.array([p[name] == value for p in plans], dtype=float))
    return np.stack(cols, axis=1)


class ResidualModel:
    """Bayesian linear regression on standardized features; ``predict`` gives mean and std of the residual."""

    def __init__(self, features: np.ndarray) -> None:
        mean, std = features.mean(axis=0), features.std(axis=0)
        keep = std > 1e-12  # constant columns carry no information
        self._mean, self._std, self._keep = mean[keep], std[keep], keep
        self.alpha, self.beta = 1.0, 1e4
        self._w = np.zeros(int(keep.sum()) + 1)
        self._cov = np.eye(len(self._w)) / self.alpha

    def _design(self, features: np.ndarray) -> np.ndarray:
        x = (features[:, self._keep] - self._mean) / self._std
        return np.hstack([np.ones((len(x), 1)), x])

    def fit(self, features: np.ndarray, residual: np.ndarray, iterations: int = 50) -> "ResidualModel":
        x, y = self._design(features), np.asarray(residual, dtype=float)
        n, d = x.shape
        xtx, xty = x.T @ x, x.T @ y
        eig = np.linalg.eigvalsh(xtx)
        for _ in range(iterations):
            a = self.alpha * np.eye(d) + self.beta * xtx
            w = self.beta * np.linalg.solve(a, xty)
            lam = self.beta * eig
            gamma = float(np.sum(lam / (lam + self.alpha)))
            alpha = gamma / max(float(w @ w), 1e-12)
            beta = max(n - gamma, 1e-6) / max(float(np.sum((y - x @ w) ** 2)), 1e-12)
            converged = abs(alpha - self.alpha) < 1e-6 * alpha and abs(beta - self.beta) < 1e-6 * beta
            self.alpha, self.beta = min(alpha, PRIOR_STD ** -2), min(beta, NOISE_STD ** -2)
            if converged:
                break
        a = self.alpha * np.eye(d) + self.beta * xtx
        self._cov = np.linalg.inv(a)
        self._w = self.beta * self._cov @ xty
        return self

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = self._design(features)
        var = 1.0 / self.beta + np.einsum("ij,jk,ik->i", x, self._cov, x)
        return x @ self._w, np.sqrt(np.maximum(var, 0.0))
