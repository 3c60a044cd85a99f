"""Results formats (SPEC 12): the version every results file carries, and
the lenient converter that reads results back.

``run_info.json``, every record, checkpoint, retry file and plan is written
with ``"format": FORMAT``; a file without it is format 1. Reading is
lenient and versioned, because a newer or an older version of the runtime
wrote what is read and a record lost is a task run again:

- a file of an earlier format goes through each converter of
  :data:`UPGRADES` from its format to the current one; then through the
  current format's own tolerance of older spellings (:func:`upgrade`: a
  retry's ``delay_seconds`` is its ``retry_delay_seconds``; a record
  without ``severity`` takes the worst of its attempts' issues);
- a key this version does not know is never a reason to skip a file: the
  results converter ignores it while structuring, and :func:`structure`
  hands back what it ignored (an :data:`Overlay`) so that the store writes
  it again with the value when the value is copied (a reuse copy). A file
  of a later format is read the same way;
- a record whose known fields cannot be structured (an issue of a severity
  this version does not know, a status it cannot parse) has no severity
  this version can trust: :func:`structure` raises :class:`Undetermined`,
  and the reader reports the task as undetermined rather than reusing it.

Config is read by the strict converter (``runtime._convert.converter``);
this one is for results only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn

from ..runtime._convert import error_line, make_results_converter, unstructure
from ..runtime._results import AttemptRecord, TaskRecord

__all__ = ["FORMAT", "UPGRADES", "Overlay", "Undetermined", "merge", "stamp", "structure", "upgrade"]

T = TypeVar("T")

#: The results format this version writes.
FORMAT = 1
_KEY = "format"

#: Converters from format ``n`` to ``n + 1``: ``(data, kind) -> data``, ``kind``
#: one of ``run_info``, ``record``, ``checkpoint``, ``retry``, ``plan``.
#: Format 1 is the first; each later format adds its predecessor's converter here.
UPGRADES: dict[int, Callable[[dict[str, Any], str], dict[str, Any]]] = {}

#: What a file held that this version does not know: the unknown keys with
#: their values, and the same for nested values (by key or list index).
Overlay = tuple[dict[str, Any], dict[Any, Any]]


class Undetermined(ValueError):
    """A record's known fields cannot be read, so neither can its severity."""


_state = threading.local()


def _detecting_factory(cls: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """Structure attrs classes ignoring unknown keys, noting that there were some."""
    inner = make_dict_structure_fn(cls, conv)
    names = frozenset(a.alias for a in attrs.fields(cls))

    def structure_lenient(value: Any, t: Any) -> Any:
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a mapping, got {type(value).__name__}")
        if not names.issuperset(value):
            _state.unknown = True
        return inner(value, t)

    return structure_lenient


_converter = make_results_converter()
_converter.register_structure_hook_factory(attrs.has, _detecting_factory)
_HOOKS: dict[type, Callable[[Any, Any], Any]] = {
    cls: _converter.get_structure_hook(cls) for cls in (TaskRecord, AttemptRecord)
}


def stamp(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (changed in place) with this version's ``format``."""
    data[_KEY] = FORMAT
    return data


def upgrade(data: Any, kind: str) -> dict[str, Any]:
    """The JSON object ``data`` of any format in the current shape (changed
    in place; ``format`` removed). Raises ``ValueError`` for what is no
    results file of any format (not an object, a format that is no number)."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    version = data.pop(_KEY, 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"unknown results format {version!r}")
    for n in range(version, FORMAT):
        data = UPGRADES[n](data, kind)
    if kind == "retry" and "delay_seconds" in data and "retry_delay_seconds" not in data:
        data["retry_delay_seconds"] = data.pop("delay_seconds")
    elif kind == "record" and data.get("severity") is None and isinstance(data.get("attempts"), list):
        data["severity"] = _severity_from_evidence(data["attempts"])
    return data


def _severity_from_evidence(attempts: list[Any]) -> str:
    """The worst severity of the attempts' issues (SPEC 6), for a record that did not say."""
    severities = set()
    for attempt in attempts:
        for issue in (attempt.get("issues") if isinstance(attempt, dict) else None) or []:
            severity = issue.get("severity") if isinstance(issue, dict) else None
            if severity not in ("fatal", "error", "warning"):
                raise Undetermined(f"no severity, and an issue of severity {severity!r}")
            severities.add(severity)
    return next((s for s in ("fatal", "error") if s in severities), "normal")


def structure(data: dict[str, Any], cls: type[T]) -> tuple[T, list[tuple[Any, Overlay]]]:
    """``data`` (current shape, see :func:`upgrade`) as a ``TaskRecord`` or
    ``AttemptRecord``, and what it held that this version does not know:
    ``(value, overlay)`` pairs for the record and each of its attempts, to
    hand to the store's ``carry``. Raises :class:`Undetermined` when a known
    field cannot be read."""
    _state.unknown = False
    try:
        value = _HOOKS[cls](data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise Undetermined(error_line(exc)) from None
    if not _state.unknown:
        return value, []
    if isinstance(value, TaskRecord):
        attempts = data.get("attempts") or []
        known = {k: v for k, v in unstructure(value).items() if k != "attempts"}
        pairs: list[tuple[Any, Overlay | None]] = [
            (value, _diff({k: v for k, v in data.items() if k != "attempts"}, known))
        ]
        pairs += [(a, _diff(raw, unstructure(a))) for a, raw in zip(value.attempts, attempts, strict=False)]
    else:
        pairs = [(value, _diff(data, unstructure(value)))]
    return value, [(v, overlay) for v, overlay in pairs if overlay is not None]


def _diff(raw: Any, known: Any) -> Overlay | None:
    """What ``raw`` holds that ``known`` (this version's JSON of the same value) does not."""
    if isinstance(raw, dict) and isinstance(known, dict):
        extra = {k: v for k, v in raw.items() if k not in known}
        nested = {k: sub for k, v in known.items() if k in raw and (sub := _diff(raw[k], v)) is not None}
        return (extra, nested) if extra or nested else None
    if isinstance(raw, list) and isinstance(known, list) and len(raw) == len(known):
        nested = {i: sub for i, (r, k) in enumerate(zip(raw, known, strict=True)) if (sub := _diff(r, k)) is not None}
        return ({}, nested) if nested else None
    return None


def merge(data: Any, overlay: Overlay) -> None:
    """Put back into ``data`` (this version's JSON, changed in place) the keys
    ``overlay`` holds; a key this version wrote itself is kept as it wrote it."""
    extra, nested = overlay
    if isinstance(data, dict):
        for key, value in extra.items():
            data.setdefault(key, value)
        for key, sub in nested.items():
            if key in data:
                merge(data[key], sub)
    elif isinstance(data, list):
        for index, sub in nested.items():
            if isinstance(index, int) and 0 <= index < len(data):
                merge(data[index], sub)
