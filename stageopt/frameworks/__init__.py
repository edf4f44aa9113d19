"""Framework profiles: the software stack's execution defaults (kernels, dropout, SP, overlap, sharding).

Owns what is not a parallelism choice but changes time or memory, so a plan
and a published run that name the same stack are modelled the same way.
Imports ``inputs`` and ``errors``; ``parallel.Plan`` carries a profile.
"""

from stageopt.frameworks.catalog import DEFAULT_FRAMEWORK, PROFILES_DIR, list_profiles, load_profile
from stageopt.frameworks.profile import FrameworkProfile

__all__ = ["DEFAULT_FRAMEWORK", "PROFILES_DIR", "FrameworkProfile", "list_profiles", "load_profile"]
