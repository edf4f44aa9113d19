"""Typed node attributes: Python values <-> ``AttributeProto`` oneof members.

ASTRA-sim converts between integer oneof members but never reads a float as
an integer, and it requires ``pg_name`` to be a string. The oneof used for each
attribute name mirrors ASTRA-sim's own example traces and STAGE's traces, so a
trace written here looks, field for field, like the ones ASTRA-sim is tested on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

from stageopt.chakra.et_schema import AttributeProto
from stageopt.errors import ConfigError

AttrValue = Union[bool, int, float, str, bytes, list, None]

# Oneof member per well-known attribute name, as the reference traces use them
# (microbench: comm_type/comm_size int64, is_cpu_op bool; STAGE: num_ops int64,
# tensor_size uint64, comm_src/comm_dst/comm_tag int32, pg_name string).
FIXED_ONEOF: dict[str, str] = {
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "comm_priority": "int32_val",
    "is_cpu_op": "bool_val",
    "pg_name": "string_val",
    "involved_dim": "bool_list",
}

_INT_RANGES: dict[str, tuple[int, int]] = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
    "sint32": (-(2**31), 2**31 - 1),
    "sint64": (-(2**63), 2**63 - 1),
    "fixed32": (0, 2**32 - 1),
    "fixed64": (0, 2**64 - 1),
    "sfixed32": (-(2**31), 2**31 - 1),
    "sfixed64": (-(2**63), 2**63 - 1),
}

INTEGER_ONEOFS: frozenset[str] = frozenset(f"{k}_val" for k in _INT_RANGES)


def _oneof_for(name: str, value: AttrValue) -> str | None:
    """Choose the oneof member for a value; None means "no value set"."""
    if value is None:
        return None
    if name in FIXED_ONEOF:
        return FIXED_ONEOF[name]
    if isinstance(value, bool):
        return "bool_val"
    if isinstance(value, int):
        return "int64_val" if value < 2**63 else "uint64_val"
    if isinstance(value, float):
        return "double_val"
    if isinstance(value, str):
        return "string_val"
    if isinstance(value, bytes):
        return "bytes_val"
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, bool) for v in value) and value:
            return "bool_list"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return "int64_list"  # also the choice for an empty list
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return "double_list"
        if all(isinstance(v, str) for v in value):
            return "string_list"
        if all(isinstance(v, bytes) for v in value):
            return "bytes_list"
    raise ConfigError(
        f"attribute {name!r}: unsupported value {value!r} ({type(value).__name__}); "
        "use bool, int, float, str, bytes or a list of one of them"
    )


def _check_scalar(name: str, oneof: str, value: Any) -> Any:
    """Reject values the chosen oneof cannot hold, naming the attribute."""
    kind = oneof[: -len("_val")] if oneof.endswith("_val") else oneof[: -len("_list")]
    if kind in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"attribute {name!r} must be an integer ({oneof}), got {value!r}; "
                "ASTRA-sim never reads a float or string as an integer"
            )
        lo, hi = _INT_RANGES[kind]
        if not lo <= value <= hi:
            raise ConfigError(f"attribute {name!r}={value} is outside the {kind} range [{lo}, {hi}]")
        return int(value)
    if kind == "bool":
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise ConfigError(f"attribute {name!r} must be a bool, got {value!r}")
        return bool(value)
    if kind == "string":
        if not isinstance(value, str):
            hint = f"; pass the string {str(value)!r}" if isinstance(value, int) else ""
            raise ConfigError(f"attribute {name!r} must be a string ({oneof}), got {value!r}{hint}")
        return value
    if kind == "bytes":
        if not isinstance(value, bytes):
            raise ConfigError(f"attribute {name!r} must be bytes, got {type(value).__name__}")
        return value
    if kind in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"attribute {name!r} must be a number, got {value!r}")
        return float(value)
    raise ConfigError(f"attribute {name!r}: unknown oneof member {oneof!r}")  # pragma: no cover


def make_attr(name: str, value: AttrValue, oneof: str | None = None) -> Any:
    """Build one ``AttributeProto``; ``oneof`` forces the member (else chosen by name/type)."""
    attr = AttributeProto(name=name)
    member = oneof if oneof is not None else _oneof_for(name, value)
    if member is None:
        return attr
    if member.endswith("_list"):
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
            raise ConfigError(f"attribute {name!r} must be a list ({member}), got {value!r}")
        getattr(attr, member).values.extend(_check_scalar(name, member, v) for v in value)
        if not value:
            getattr(attr, member).SetInParent()
    else:
        setattr(attr, member, _check_scalar(name, member, value))
    return attr


def attr_value(attr: Any) -> AttrValue:
    """The Python value of an ``AttributeProto``'s set oneof member (None if unset)."""
    member = attr.WhichOneof("value")
    if member is None:
        return None
    if member.endswith("_list"):
        return list(getattr(attr, member).values)
    return getattr(attr, member)


def node_attrs(node: Any) -> dict[str, AttrValue]:
    """All attributes of a node as ``{name: value}``; a repeated name keeps the last value."""
    return {a.name: attr_value(a) for a in node.attr}


def attr_oneofs(node: Any) -> dict[str, str | None]:
    """Which oneof member each attribute uses; the validator needs the wire type, not just the value."""
    return {a.name: a.WhichOneof("value") for a in node.attr}
