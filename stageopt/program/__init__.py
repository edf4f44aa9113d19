"""Per-stage programs of one training iteration, lowered to Chakra trace sets.

Owns what one rank of each pipeline stage executes, in schedule order, and
its serialization into per-rank Chakra files.

``build_programs(work)`` gives one :class:`StageProgram` per pipeline stage: a
plain, rank-independent list of :class:`ProgramNode` records (kernels,
collectives on a group *kind*, messages to the *next*/*prev* stage) with the
schedule encoded in the dependencies (see :mod:`stageopt.program.stage_program`).
Simulators replay one representative rank per stage from it;
:func:`stageopt.program.generate.generate` writes a full ASTRA-sim input set
by serializing each stage once and patching ranks. Imports ``workload``,
``graph``, ``parallel``, ``hardware``, ``chakra`` and ``astrasim`` (config
writers); no simulator.

Settings that change a trace but not its totals:

* ``ProgramOptions.bucket`` (CLI ``--dp-bucket``): gradient-sync granularity,
  ``layer`` (default), ``chunk`` or ``stage``; the plan's ``dp_overlap=off``
  forces ``stage`` (no overlap with backward).
* The ASTRA-sim binary that ``run_astrasim.sh`` runs comes from the
  ``STAGEOPT_ASTRA_SIM`` environment variable (a path or a command on PATH).
"""

from stageopt.program.nodes import ProgramNode, StageProgram
from stageopt.program.stage_program import BUCKETS, ProgramOptions, build_programs, build_stage_program

__all__ = ["BUCKETS", "ProgramNode", "ProgramOptions", "StageProgram", "build_programs", "build_stage_program"]
