"""stageopt: find the best parallel plan (and hardware) for training an LLM, with simulators.

Packages from the bottom floor up; each imports only from packages listed
before it: ``model``, ``graph``, ``parallel``, ``hardware``, ``workload``,
``chakra``, ``program``, ``sim``, ``astrasim``, ``search``, ``validation``,
``commands``. ``docs/architecture.md`` draws the flow.
"""

from importlib.metadata import PackageNotFoundError, version

from stageopt import _deprecated

try:
    __version__ = version("stageopt")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

_deprecated.install()
