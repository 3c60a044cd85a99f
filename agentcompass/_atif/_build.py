"""An attempt's trajectory in ATIF (SPEC 12 "Trajectories"): Harbor's RFC 0001, v1.7.

:func:`to_atif` reads the runtime's own trajectory of an attempt
(``RunResult.trajectory``: ``system`` and ``user`` messages, an ``assistant``
entry per model call with its ``tool_calls``, ``usage``, ``status`` and
timing, and ``tool`` entries with each call's result; the same shape whether
the runtime's ``react`` loop, the model gateway's record or an agent's own
log, matched to the gateway's calls, made it) into an ATIF document:

- a ``system`` or ``user`` message is a step of that source;
- each assistant entry of a model call (one with ``step``, ``call``,
  ``usage`` or ``status``) is one ``agent`` step (``llm_call_count`` 1), its text the ``message``, its tool calls ``tool_calls`` (arguments as an
  object; text that is not a JSON object is kept as ``{"input": text}``), its
  usage the step's ``metrics`` (``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens``, ``cost_usd`` when known) and the call's number, HTTP
  status and duration its ``extra``; an assistant message the agent put in
  its prompt itself (aider's example turns) is an ``agent`` step with
  ``is_copied_context`` (no metrics, no call);
- the ``tool`` entries after it are its ``observation`` results, matched by
  ``source_call_id`` (a result with no agent step before it becomes a
  ``system`` step's observation);
- ``final_metrics`` sums the steps (``total_cost_usd`` only when every call's
  cost is known) and its ``extra`` has the attempt's usage and issues.

The runtime's own trajectory stays in the record; this is a second view of it.
"""

from __future__ import annotations

import json
from typing import Any

from .._models._cost import total_cost

__all__ = ["SCHEMA_VERSION", "to_atif"]

SCHEMA_VERSION = "ATIF-v1.7"


def to_atif(
    trajectory: list[Any],
    *,
    session_id: str,
    agent: str,
    agent_version: str,
    model_name: str | None,
    usage: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ATIF document of ``trajectory`` (see the module docstring)."""
    steps: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for entry in trajectory:
        if not isinstance(entry, dict):
            continue
        role = entry.get("role")
        if role == "tool":
            if current is None:
                current = _step(steps, "system", "tool results")
            results = current.setdefault("observation", {"results": []})["results"]
            results.append(_result(entry))
        elif role == "assistant":
            current = _step(steps, "agent", _text(entry.get("content")))
            if any(key in entry for key in _CALL_KEYS):
                _agent_fields(current, entry, model_name)
            else:
                _context_fields(current, entry)
        elif role in ("system", "developer", "user"):
            _step(steps, "system" if role == "developer" else role, _text(entry.get("content")))
            current = None
    metrics = [s["metrics"] for s in steps if "metrics" in s]
    final: dict[str, Any] = {
        "total_prompt_tokens": sum(m.get("prompt_tokens", 0) for m in metrics),
        "total_completion_tokens": sum(m.get("completion_tokens", 0) for m in metrics),
        "total_cached_tokens": sum(m.get("cached_tokens", 0) for m in metrics),
        "total_steps": len(steps),
    }
    cost = total_cost(m.get("cost_usd") for m in metrics)
    if cost is not None:
        final["total_cost_usd"] = cost
    if usage:
        final["extra"] = {"usage": usage}
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "session_id": session_id,
        "agent": {"name": agent, "version": agent_version, **({"model_name": model_name} if model_name else {})},
        "steps": steps,
        "final_metrics": final,
    }
    if extra:
        document["extra"] = extra
    return document


#: What marks an assistant entry as a model call of this attempt (react's
#: ``step``, the gateway's ``call``, either's ``usage``).
_CALL_KEYS = ("call", "step", "usage", "status")


def _context_fields(step: dict[str, Any], entry: dict[str, Any]) -> None:
    """An assistant message the agent wrote into its prompt (aider's example
    turns): context, not a call, so ATIF's copied-context step."""
    step["is_copied_context"] = True
    calls = [c for c in entry.get("tool_calls") or () if isinstance(c, dict)]
    if calls:
        step["tool_calls"] = [_tool_call(c) for c in calls]


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "tool_call_id": str(call.get("id") or ""),
        "function_name": str(call.get("name") or ""),
        "arguments": _arguments(call),
    }


def _step(steps: list[dict[str, Any]], source: str, message: str) -> dict[str, Any]:
    step = {"step_id": len(steps) + 1, "source": source, "message": message}
    steps.append(step)
    return step


def _text(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _agent_fields(step: dict[str, Any], entry: dict[str, Any], model_name: str | None) -> None:
    if model_name:
        step["model_name"] = model_name
    calls = [c for c in entry.get("tool_calls") or () if isinstance(c, dict)]
    if calls:
        step["tool_calls"] = [_tool_call(c) for c in calls]
    usage = entry.get("usage")
    if isinstance(usage, dict):
        metrics = {
            k: usage[k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens") if _is_count(usage.get(k))
        }
        if isinstance(usage.get("cost_usd"), (int, float)):
            metrics["cost_usd"] = usage["cost_usd"]
        step["metrics"] = metrics
    step["llm_call_count"] = 1
    extra = {k: entry[k] for k in ("call", "step", "status", "duration_seconds") if k in entry}
    if extra:
        step["extra"] = extra


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    raw = call.get("arguments")
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"input": raw}


def _result(entry: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"content": _text(entry.get("content"))}
    if entry.get("tool_call_id"):
        result["source_call_id"] = str(entry["tool_call_id"])
    extra = {k: entry[k] for k in ("name", "exit_code", "timed_out", "truncated", "duration_seconds") if k in entry}
    if extra:
        result["extra"] = extra
    return result


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
