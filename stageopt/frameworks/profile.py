"""FrameworkProfile: the software stack a plan runs on, as data.

Why a profile and not plan fields: a published run names its stack
(Megatron-LM of 2021, Megatron-Core/NeMo, Megatron-DeepSpeed, torchtitan), and
the stack decides every execution default that is not a parallelism choice —
which attention kernel runs, whether dropout runs, whether sequence
parallelism comes with tensor parallelism, whether communication overlaps
compute, how the optimizer is sharded. Naming the stack lets a user's plan
and a validation row be written the same way; plan knobs (``sp``,
``tp_overlap``, ``dp_overlap``, ``zero``) still override it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stageopt.errors import ConfigError

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved")
BUCKETS = ("layer", "chunk", "stage")


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameworkProfile:
    """Execution defaults of one training stack (see ``simulators/frameworks/*.yaml``).

    ``attention`` and ``dropout`` set to ``None`` defer to the model file
    (its ``attention`` and ``dropout`` fields). ``distributed_optimizer`` makes
    ZeRO-1 (optimizer states sharded over data parallelism) the default when
    dp > 1; ``fsdp`` makes ZeRO-3 (parameters too) the default. ``dp_bucket``
    is the granularity of gradient synchronisation in traces and replay.
    """

    name: str
    description: str = ""
    source: str = ""
    attention: Literal["flash", "eager"] | None = None
    dropout: bool | None = None
    sequence_parallel: bool = True
    tp_comm_overlap: bool = False
    dp_comm_overlap: bool = True
    distributed_optimizer: bool = True
    fsdp: bool = False
    dp_bucket: Literal["layer", "chunk", "stage"] = "layer"
    schedules: tuple[str, ...] = SCHEDULE_NAMES

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("framework profile: name is empty; give the profile a name")
        unknown = [s for s in self.schedules if s not in SCHEDULE_NAMES]
        if unknown or not self.schedules:
            raise ConfigError(f"framework {self.name}: schedules {list(self.schedules)} must be a non-empty "
                              f"list of {', '.join(SCHEDULE_NAMES)}")

    def default_zero(self, dp: int, cp: int = 1) -> int:
        """The ZeRO stage this stack uses when the plan does not say (states shard over dp x cp)."""
        if dp * cp <= 1:
            return 0
        return 3 if self.fsdp else (1 if self.distributed_optimizer else 0)
