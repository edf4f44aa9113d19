"""Published training runs, and how far the cost model is from them.

Owns the published-runs table format (rows a user could type: model, plan,
framework, hardware, the measurement in its source's metric), the sources' FLOP
conventions, and the error metrics (per-source MAPE, rank correlation within
families of plans, top-1 regret), and the fit of a hardware file's kernel shares
to measured runs (the shipped presets' calibration and ``stageopt calibrate``).
Imports ``stageopt.sim.run``; the experiments, the tests and ``stageopt calibrate``
import it.
"""

from stageopt.validation.compare import (Comparison, family_ranking, mape, precision_pairs, predict, predict_all,
                                        recipe_repeats, repeated_setups, scale_pairs)
from stageopt.validation.flops import FORMULAS, source_flops
from stageopt.validation.runs import METRICS, PublishedRun, load_runs

__all__ = ["FORMULAS", "METRICS", "Comparison", "PublishedRun", "family_ranking", "load_runs", "mape",
           "precision_pairs", "predict", "predict_all", "recipe_repeats", "repeated_setups", "scale_pairs",
           "source_flops"]
