"""The columns of a measured-runs CSV (``stageopt calibrate``; the reader is :mod:`stageopt.validation.measured`).

Apart from the reader so that the command line can name them in its help without importing the simulators.
"""

REQUIRED = ("model", "plan", "metric", "value")
OPTIONAL = ("set", "gpus", "framework", "hw_set", "group", "flops_formula", "id")
