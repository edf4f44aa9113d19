"""Per-stage programs of one training iteration, and their Chakra traces.

``build_programs(work)`` gives one :class:`StageProgram` per pipeline stage (a
plain list of :class:`ProgramNode` records, rank-independent); ``generate``
writes a trace set from them by serializing each stage once and patching
ranks.
"""

from stageopt.program.nodes import ProgramNode, StageProgram
from stageopt.program.stage_program import BUCKETS, ProgramOptions, build_programs, build_stage_program

__all__ = ["BUCKETS", "ProgramNode", "ProgramOptions", "StageProgram", "build_programs", "build_stage_program"]
