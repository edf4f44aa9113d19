"""Published training runs as stageopt inputs, and how far the cost model is from them.

Owns the reading of measurement tables into (model, plan, hardware, measured
value) cases and the error metrics. Imports the simulators; nothing below
imports it (experiments and tests do).
"""

from stageopt.validation.published import GPU_PRESET, Case, load_cases, mape, predict, row_to_case

__all__ = ["GPU_PRESET", "Case", "load_cases", "mape", "predict", "row_to_case"]
