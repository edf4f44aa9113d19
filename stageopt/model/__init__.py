"""Model architectures: the ModelSpec type and its presets."""

from stageopt.model.load import list_model_presets, load_model, parse_overrides, spec_from_dict
from stageopt.model.spec import ModelSpec

__all__ = ["ModelSpec", "list_model_presets", "load_model", "parse_overrides", "spec_from_dict"]
