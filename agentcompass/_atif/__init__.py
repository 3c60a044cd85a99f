"""ATIF, the Agent Trajectory Interchange Format (Harbor's RFC 0001): the runtime writes it, the viewer reads it.

``atif.schema.json`` (shipped with the package) is a JSON Schema of the
format's newest version the RFC publishes, v1.7, written from the RFC's
tables; :func:`validate` checks a document against it and against the rules
a schema cannot state (step ids 1, 2, 3, ...; every ``source_call_id`` names
a tool call of its step).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from ._build import SCHEMA_VERSION as SCHEMA_VERSION
from ._build import to_atif as to_atif

__all__ = ["SCHEMA_VERSION", "schema", "to_atif", "validate"]


@functools.cache
def schema() -> dict[str, Any]:
    """The shipped JSON Schema (``atif.schema.json``)."""
    data: dict[str, Any] = json.loads(resources.files(__name__).joinpath("atif.schema.json").read_text())
    return data


def validate(document: Any, *, limit: int = 20) -> list[str]:
    """The problems of ``document`` as an ATIF trajectory (at most ``limit``), one line each; [] when valid."""
    import jsonschema  # only readers of ATIF need it loaded

    validator = jsonschema.Draft202012Validator(schema())
    problems = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        problems.append(f"{where}: {error.message[:300]}")
        if len(problems) >= limit:
            return problems
    if problems or not isinstance(document, dict):
        return problems
    for index, step in enumerate(document.get("steps") or [], 1):
        if step.get("step_id") != index:
            problems.append(f"$.steps[{index - 1}].step_id: {step.get('step_id')!r}, expected {index}")
        calls = {c.get("tool_call_id") for c in step.get("tool_calls") or ()}
        for result in (step.get("observation") or {}).get("results") or ():
            source = result.get("source_call_id")
            if source is not None and step.get("source") == "agent" and source not in calls:
                problems.append(f"$.steps[{index - 1}].observation: source_call_id {source!r} names no tool call")
    return problems[:limit]
