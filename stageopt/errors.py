"""Error types that separate user mistakes from bugs.

Every error a user can cause derives from :class:`StageoptError`. Its message is
one line that names the field, the bad value and a fix; the CLI prints it and
exits with code 2. Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations


class StageoptError(Exception):
    """A problem with what the user asked for (exit code 2)."""

    exit_code = 2


class ConfigError(StageoptError):
    """A model, hardware, space or simulator config file or override is invalid."""


class InfeasiblePlan(StageoptError):
    """A parallel plan that cannot run on the given model and GPU count."""


class SimulatorError(StageoptError):
    """An external simulator is missing, crashed, timed out or printed nonsense."""
