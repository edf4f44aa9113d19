"""The one door every user file comes through: bytes, encoding, size, YAML aliases, JSON constants.

Why one door: each reader used to open its file its own way, so a binary file,
a UTF-16 file, a YAML alias bomb or a JSON ``NaN`` broke some readers with a
traceback or unbounded memory and not others. Here a file is read once as
bytes, refused above a size limit, decoded as strict UTF-8, and parsed:

* YAML with a SafeLoader that rejects duplicate keys and counts the nodes the
  document expands to (aliases included) before building any Python object,
  so ``&a [*a, *a, ...]`` nested ten deep is refused at load instead of
  exhausting memory later when something prints it;
* JSON without the non-standard ``NaN``/``Infinity`` constants, and without
  repeated keys (``json`` keeps the last one silently, as PyYAML does).

Every failure is a :class:`~stageopt.errors.ConfigError` with one line naming
the file and the fix. Values quoted in messages go through :func:`shorten`.
"""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Mapping
from itertools import accumulate
from pathlib import Path
from typing import Any

import yaml

from stageopt.errors import ConfigError

CONFIG_MAX_BYTES = 2**20  # a hand-written config is a few KB (the largest shipped is ~5 KB)
MAX_EXPANDED_NODES = 100_000  # the largest shipped space expands to < 1,000 YAML nodes
MAX_FLOW_DEPTH = 64  # shipped configs nest at most 3 deep
_SHORT = 80
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_FLOW_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}

_BOMS = {b"\xff\xfe": "UTF-16 (little-endian)", b"\xfe\xff": "UTF-16 (big-endian)",
         b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32"}

_REPR = reprlib.Repr()  # keyword arguments only from Python 3.12
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 6, 6, 4, 6
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 60, 40, 60


def shorten(value: object, limit: int = _SHORT) -> str:
    """A bounded ``repr`` of ``value``, so one bad value cannot flood an error line.

    ``reprlib`` stops at a few items and levels, so a structure built from
    shared aliases is never expanded in full just to be cut.
    """
    text = _REPR.repr(value)
    if len(text) > limit:
        text = f"{text[: limit - 15]}... ({len(text)} chars)"
    return text.replace("\n", "\\n")


def clip(text: str, limit: int = _SHORT) -> str:
    """Plain text cut to ``limit`` characters (for echoing what the user typed)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} chars)"


def read_text(path: Path | str, what: str, max_bytes: int = CONFIG_MAX_BYTES) -> str:
    """The file's text: strict UTF-8, at most ``max_bytes``; one-line errors otherwise.

    ``what`` names the file's role in messages (e.g. ``"model file"``).
    """
    path = Path(path)
    try:
        with path.open("rb") as stream:
            data = stream.read(max_bytes + 1)
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory; give a file") from None
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror or err}; check the path") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{what} {path} is larger than {max_bytes / 2**20:g} MiB; "
                          "a config this large is not hand-written, check that it is the right file")
    return decode_text(data, path, what)


def decode_text(data: bytes, path: Path | str, what: str) -> str:
    """Strict UTF-8 (a UTF-8 BOM is allowed); UTF-16/32 and binary files get a named refusal."""
    for bom, name in sorted(_BOMS.items(), key=lambda kv: -len(kv[0])):
        if data.startswith(bom):
            raise ConfigError(f"{what} {path} is encoded as {name}; save it as UTF-8")
    if b"\x00" in data:
        raise ConfigError(f"{what} {path} contains NUL bytes: it is binary (or UTF-16 without a byte-order mark), "
                          "not text; give a UTF-8 text file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                          "save it as UTF-8") from None


class _GateLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _mapping_no_duplicates(loader: _GateLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key (a list or mapping used as a key)
            mark = key_node.start_mark
            raise ConfigError(f"{mark.name}:{mark.line + 1}: a list or mapping used as a key; keys are "
                              "plain words") from None
        if duplicate:
            mark = key_node.start_mark
            raise ConfigError(f"{mark.name}:{mark.line + 1}: duplicate key {shorten(key)}; keep only one")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_GateLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_duplicates)


def expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes the document has once every alias is replaced by a copy of its anchor.

    Counted on the composed node graph (where an alias is a shared node), with
    memoization, so the count costs O(distinct nodes) however large the
    expansion; it stops as soon as ``limit`` is passed. A node that contains
    itself (a recursive alias) counts as past the limit.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            return limit + 1
        total = 1
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            active.add(key)
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
            for child in children:
                total += size(child)
                if total > limit:
                    break
            active.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _yaml_error(err: yaml.YAMLError, path: Path | str) -> ConfigError:
    mark = getattr(err, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    return ConfigError(f"{where}: malformed YAML ({problem}); fix the syntax")


def flow_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` brackets (quoted ones counted too: an upper bound).

    Why: PyYAML's scanner revisits every open flow level at each token, so
    ``[[[[...`` costs time quadratic in its depth (a 4 MiB file would never
    finish); counting brackets first costs one pass in C.
    """
    brackets = _NOT_BRACKET.sub("", text)
    return max(accumulate(map(_FLOW_DELTA.__getitem__, brackets)), default=0)


def parse_yaml(text: str, path: Path | str, max_nodes: int = MAX_EXPANDED_NODES) -> Any:
    """Parse one YAML document with the gate's rules (see the module docstring)."""
    if flow_depth(text) > MAX_FLOW_DEPTH:
        raise ConfigError(f"{path}: the YAML nests [ ] or {{ }} more than {MAX_FLOW_DEPTH} deep; a config is never "
                          "nested like that, flatten it")
    try:
        loader = _GateLoader(text)  # the reader refuses control characters here already
    except yaml.YAMLError as err:
        raise _yaml_error(err, path) from None
    loader.name = str(path)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        if expanded_size(root, max_nodes) > max_nodes:
            raise ConfigError(f"{path}: the YAML expands to more than {max_nodes:,} nodes (aliases '*' repeat "
                              "their anchor's content, possibly recursively); write the values out plainly")
        return loader.construct_document(root)
    except yaml.YAMLError as err:
        raise _yaml_error(err, path) from None
    except RecursionError:
        raise ConfigError(f"{path}: the YAML is nested too deeply to be a config; flatten it") from None
    finally:
        loader.dispose()


def _no_constant(name: str) -> None:
    raise ValueError(name)


class _DuplicateKey(ValueError):
    pass


def _object_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _DuplicateKey(dup)
    return out


def parse_json(text: str, path: Path | str) -> Any:
    """Parse JSON, refusing ``NaN``/``Infinity`` (not JSON, and never a valid size or count) and repeated keys."""
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_object_no_duplicates)
    except _DuplicateKey as err:
        raise ConfigError(f"{path}: duplicate key {shorten(err.args[0])} in a JSON object; keep only one") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                          "fix the syntax") from None
    except ValueError as err:
        raise ConfigError(f"{path}: JSON holds {err.args[0]}, which is not a number JSON allows; "
                          "give a finite number") from None
    except RecursionError:
        raise ConfigError(f"{path}: the JSON is nested too deeply to be a config; flatten it") from None


def load_document(path: Path | str, what: str, *, json_file: bool | None = None,
                  max_bytes: int = CONFIG_MAX_BYTES) -> Any:
    """Read and parse a YAML or JSON file through the gate (JSON when the suffix is ``.json``)."""
    path = Path(path)
    text = read_text(path, what, max_bytes)
    is_json = path.suffix.lower() == ".json" if json_file is None else json_file
    return parse_json(text, path) if is_json else parse_yaml(text, path)


def load_yaml_mapping(path: Path | str, what: str = "config file") -> Mapping[str, object]:
    """Read a YAML file whose top level must be a mapping of keys."""
    data = load_document(path, what, json_file=False)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: top level must be a mapping of keys, got {type(data).__name__}")
    return data
