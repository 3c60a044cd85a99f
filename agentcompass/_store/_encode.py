"""The JSON text of what the run store writes, masked: orjson where it can, the standard encoder for what it refuses."""

from __future__ import annotations

import json
from typing import Any

import attrs
import orjson

from .. import _redact
from ..runtime._convert import unstructure

__all__ = ["compact", "encode_lines", "mask", "pretty"]


def _json_default(value: Any) -> Any:
    # Free-form data never fails to serialize: an odd field (a Path, an
    # exception) is written as text rather than losing the line.
    return unstructure(value) if attrs.has(type(value)) else str(value)


_COMPACT = json.JSONEncoder(separators=(",", ":"), default=_json_default)
_PRETTY = json.JSONEncoder(indent=2, default=_json_default)
# Dates and dataclasses go through ``_json_default`` as with the standard encoder.
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def compact(data: Any) -> str:
    """One-line JSON text of ``data`` (records, checkpoints, journal and
    progress lines): orjson, as the standard encoder calls back into
    Python for every float (bench: overhead). The standard
    encoder takes what orjson refuses (a lone surrogate, an integer beyond
    64 bits). NaN and infinities are written as ``null``."""
    try:
        return orjson.dumps(data, default=_json_default, option=_ORJSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return _COMPACT.encode(data)


def pretty(data: Any) -> str:
    """Indented JSON text of ``data`` (the run directory's summary files)."""
    return _PRETTY.encode(data)


def mask(text: str) -> str:
    """``text`` with every registered secret and credential shape masked,
    without breaking the JSON (SPEC 8: no secret in any file)."""
    return _redact.redact_json_text(text)


def encode_lines(events: list[tuple[str, float, dict[str, Any]]]) -> bytes:
    """``progress.jsonl`` lines, masked as one text (no pattern spans a line:
    JSON escapes every newline inside a string)."""
    lines = []
    for kind, now, fields in events:
        if "event" in fields or "t" in fields:
            fields = {name: value for name, value in fields.items() if name != "event" and name != "t"}
        lines.append(compact({"event": kind, "t": now, **fields}))
    lines.append("")
    return mask("\n".join(lines)).encode()
