"""Model architectures as plain data: :class:`ModelSpec`, its presets, YAML and Hugging Face import.

Owns what a model *is* (layers, widths, heads, experts), never how it is
trained or sharded. Imports only ``stageopt.errors``.
"""

from stageopt.model.load import list_model_presets, load_model, parse_overrides, spec_from_dict
from stageopt.model.spec import ModelSpec

__all__ = ["ModelSpec", "list_model_presets", "load_model", "parse_overrides", "spec_from_dict"]
