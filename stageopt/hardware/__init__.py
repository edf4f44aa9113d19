"""The machine a plan runs on, and what things cost on it.

Owns the typed hardware spec (GPU, NVLink domain, scale-out tiers, price), its
presets and overrides, kernel efficiency, and collective and network times.
Imports only ``stageopt.errors``; every simulator reads its costs from here.
"""

from stageopt.hardware.collectives import CollectiveAlgorithms, CollectiveKind
from stageopt.hardware.efficiency import GpuEfficiency, KernelEfficiency, MatmulEfficiency
from stageopt.hardware.machine import DTYPE_BYTES, DType, Gpu, Hardware, Node, PeakTflops, ScaleOut, Tier
from stageopt.hardware.presets import (
    PRESETS_DIR,
    SIMULATORS_DIR,
    apply_hw_overrides,
    hardware_from_dict,
    hw_override_keys,
    list_hardware_presets,
    load_hardware,
)

__all__ = [
    "DTYPE_BYTES", "CollectiveAlgorithms", "CollectiveKind", "DType", "Gpu", "GpuEfficiency", "Hardware",
    "KernelEfficiency", "MatmulEfficiency", "Node", "PRESETS_DIR", "PeakTflops", "SIMULATORS_DIR", "ScaleOut",
    "Tier", "apply_hw_overrides", "hardware_from_dict", "hw_override_keys", "list_hardware_presets",
    "load_hardware",
]
