"""Attempt and task records to and from their JSON form, fast.

The store writes one record per task and reads thousands back on reuse, so
the generic converter (:mod:`agentcompass._convert`) would be a large share
of the per-attempt cost. These functions produce exactly what the converter
produces (``tests/store/test_store_records.py`` checks that on generated
records) with plain dict building:

* the values the contracts type as ``Any`` (``values``, ``output``,
  ``trajectory``, ``artifacts``, ``data``, ...) are passed through as they
  are; the JSON encoder's ``default`` turns anything JSON cannot hold into
  what the converter would have made of it (attrs values, ``Secret``, paths);
* reading back goes through the converter whenever the fast path meets
  something it does not expect, so a malformed file gets the converter's
  precise one-line error and nothing odd is accepted silently.

Component references and network policies repeat across every attempt of a
request, so their converted forms are cached.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from .._convert import converter, unstructure
from ..runtime._results import AttemptRecord, Issue, RunResult, TaskRecord
from ..runtime._values import ComponentRef, ExecutionPlan, NetworkPolicy, PreparedTask, TaskSpec

__all__ = ["attempt_from_data", "attempt_to_data", "task_from_data"]


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in attrs.fields(cls))


# The functions below spell each class's fields out; they are only right
# while the classes have exactly these fields, in this order.
assert _names(AttemptRecord) == (
    "attempt", "status", "values", "issues", "run_result", "plan", "analysis", "retries", "timings", "prepared",
)  # fmt: skip
# ``retry_after_seconds`` is a hint for the next retry of the running attempt, not a result: not kept.
assert _names(Issue) == ("severity", "phase", "code", "message", "retry_after_seconds")
assert _names(RunResult) == ("output", "trajectory", "usage", "artifacts", "issues", "timings")
assert _names(ExecutionPlan) == (
    "task_id", "attempt", "environment", "harness", "benchmark_plan", "evaluation_environment_mode",
    "baseline_network_policy", "run_network_policy", "evaluation_network_policy",
    "run_timeout_seconds", "evaluation_timeout_seconds",
)  # fmt: skip
assert _names(PreparedTask) == ("task", "input", "metadata")
assert _names(TaskSpec) == ("task_id", "data", "category", "metadata")
assert _names(TaskRecord) == ("task_id", "category", "attempts", "severity")
assert _names(NetworkPolicy) == ("mode", "allow")
assert _names(ComponentRef) == ("id", "config")

_SEVERITIES = frozenset({"fatal", "error", "warning"})
_PHASES = frozenset({"setup", "run", "collect", "evaluate", "cleanup"})
_STATUSES = frozenset({"completed", "run_error", "eval_error", "run_error_or_eval_error"})
_TASK_SEVERITIES = frozenset({"fatal", "error", "normal"})
_MODES = frozenset({"reuse", "none", "fresh"})

# -- to data ----------------------------------------------------------------------

# Keyed by id() with the object kept alive next to its form: these are the
# request's own refs and a handful of policies, shared by every attempt.
_ref_data: dict[int, tuple[ComponentRef, Any]] = {}
_policy_data: dict[int, tuple[NetworkPolicy, dict[str, Any]]] = {}


def _ref_to_data(ref: ComponentRef) -> Any:
    cached = _ref_data.get(id(ref))
    if cached is not None and cached[0] is ref:
        return cached[1]
    data = unstructure(ref)
    if len(_ref_data) < 256:
        _ref_data[id(ref)] = (ref, data)
    return data


def _policy_to_data(policy: NetworkPolicy) -> dict[str, Any]:
    cached = _policy_data.get(id(policy))
    if cached is not None and cached[0] is policy:
        return cached[1]
    data = {"mode": policy.mode, "allow": list(policy.allow)}
    if len(_policy_data) < 256:
        _policy_data[id(policy)] = (policy, data)
    return data


def _issue_to_data(issue: Issue) -> dict[str, Any]:
    return {"severity": issue.severity, "phase": issue.phase, "code": issue.code, "message": issue.message}


def _plan_to_data(plan: ExecutionPlan) -> dict[str, Any]:
    return {
        "task_id": plan.task_id,
        "attempt": plan.attempt,
        "environment": _ref_to_data(plan.environment),
        "harness": _ref_to_data(plan.harness),
        "benchmark_plan": plan.benchmark_plan,
        "evaluation_environment_mode": plan.evaluation_environment_mode,
        "baseline_network_policy": _policy_to_data(plan.baseline_network_policy),
        "run_network_policy": _policy_to_data(plan.run_network_policy),
        "evaluation_network_policy": _policy_to_data(plan.evaluation_network_policy),
        "run_timeout_seconds": plan.run_timeout_seconds,
        "evaluation_timeout_seconds": plan.evaluation_timeout_seconds,
    }


def _run_result_to_data(result: RunResult) -> dict[str, Any]:
    return {
        "output": result.output,
        "trajectory": result.trajectory,
        "usage": result.usage,
        "artifacts": result.artifacts,
        "issues": [_issue_to_data(i) for i in result.issues],
        "timings": result.timings,
    }


def _prepared_to_data(prepared: PreparedTask) -> dict[str, Any]:
    task = prepared.task
    return {
        "task": {"task_id": task.task_id, "data": task.data, "category": task.category, "metadata": task.metadata},
        "input": prepared.input,
        "metadata": prepared.metadata,
    }


def attempt_to_data(record: AttemptRecord) -> dict[str, Any]:
    """``record`` as the JSON-ready dict the converter would make of it
    (values typed ``Any`` are left for the JSON encoder's ``default``)."""
    return {
        "attempt": record.attempt,
        "status": record.status,
        "values": record.values,
        "issues": [_issue_to_data(i) for i in record.issues],
        "run_result": None if record.run_result is None else _run_result_to_data(record.run_result),
        "plan": None if record.plan is None else _plan_to_data(record.plan),
        "analysis": record.analysis,
        "retries": record.retries,
        "timings": record.timings,
        "prepared": None if record.prepared is None else _prepared_to_data(record.prepared),
    }


# -- from data --------------------------------------------------------------------


class _Unexpected(Exception):
    """The fast path met something it does not check itself."""


def _dict(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise _Unexpected
    return value


def _list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise _Unexpected
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise _Unexpected
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _int(value: Any) -> int:
    if type(value) is not int:
        raise _Unexpected
    return value


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise _Unexpected


def _in(value: Any, allowed: frozenset[str]) -> Any:
    if value not in allowed or type(value) is not str:
        raise _Unexpected
    return value


def _keys(data: dict[str, Any], count: int) -> None:
    # The converter forbids unknown keys; with every known key read below,
    # a count check is enough to send anything extra its way.
    if len(data) != count:
        raise _Unexpected


def _issue_from_data(data: Any) -> Issue:
    data = _dict(data)
    _keys(data, 4)
    return Issue(_in(data["severity"], _SEVERITIES), _in(data["phase"], _PHASES), _str(data["code"]), _str(data["message"]))


T = TypeVar("T")

#: Most records of a run share a handful of refs and policies: read each once.
_refs_read: dict[tuple[str, str], ComponentRef] = {}
_policies_read: dict[tuple[str, tuple[str, ...]], NetworkPolicy] = {}
_CACHE_SIZE = 256


def _cached(cache: dict[Any, T], key: Any, data: dict[str, Any], cls: type[T]) -> T:
    """``converter.structure(data, cls)``, kept in ``cache`` under ``key``
    (a value's JSON identity) while the cache is small."""
    value = cache.get(key)
    if value is None:
        value = converter.structure(data, cls)
        if len(cache) < _CACHE_SIZE:
            cache[key] = value
    return value


def _ref_from_data(data: Any) -> ComponentRef:
    data = _dict(data)
    _keys(data, 2)
    key = (_str(data["id"]), repr(_dict(data["config"])))  # JSON values: repr tells them apart
    # Secret-named config keys become Secret values: the converter's business.
    return _cached(_refs_read, key, data, ComponentRef)


def _policy_from_data(data: Any) -> NetworkPolicy:
    data = _dict(data)
    _keys(data, 2)
    key = (_str(data["mode"]), tuple(_str(host) for host in _list(data["allow"])))
    return _cached(_policies_read, key, data, NetworkPolicy)


def _plan_from_data(data: Any) -> ExecutionPlan:
    data = _dict(data)
    _keys(data, 11)
    return ExecutionPlan(
        task_id=_str(data["task_id"]),
        attempt=_int(data["attempt"]),
        environment=_ref_from_data(data["environment"]),
        harness=_ref_from_data(data["harness"]),
        benchmark_plan=_dict(data["benchmark_plan"]),
        evaluation_environment_mode=_in(data["evaluation_environment_mode"], _MODES),
        baseline_network_policy=_policy_from_data(data["baseline_network_policy"]),
        run_network_policy=_policy_from_data(data["run_network_policy"]),
        evaluation_network_policy=_policy_from_data(data["evaluation_network_policy"]),
        run_timeout_seconds=_opt_float(data["run_timeout_seconds"]),
        evaluation_timeout_seconds=_opt_float(data["evaluation_timeout_seconds"]),
    )


def _run_result_from_data(data: Any) -> RunResult:
    data = _dict(data)
    _keys(data, 6)
    return RunResult(
        output=data["output"],
        trajectory=_list(data["trajectory"]),
        usage=_dict(data["usage"]),
        artifacts=_dict(data["artifacts"]),
        issues=[_issue_from_data(i) for i in _list(data["issues"])],
        timings=_dict(data["timings"]),
    )


def _prepared_from_data(data: Any) -> PreparedTask:
    data = _dict(data)
    _keys(data, 3)
    task = _dict(data["task"])
    _keys(task, 4)
    spec = TaskSpec(_str(task["task_id"]), _dict(task["data"]), _opt_str(task["category"]), _dict(task["metadata"]))
    return PreparedTask(spec, _dict(data["input"]), _dict(data["metadata"]))


def _attempt_fast(data: Any) -> AttemptRecord:
    data = _dict(data)
    _keys(data, 10)
    run_result, plan, prepared = data["run_result"], data["plan"], data["prepared"]
    return AttemptRecord(
        attempt=_int(data["attempt"]),
        status=_in(data["status"], _STATUSES),
        values=_dict(data["values"]),
        issues=[_issue_from_data(i) for i in _list(data["issues"])],
        run_result=None if run_result is None else _run_result_from_data(run_result),
        plan=None if plan is None else _plan_from_data(plan),
        analysis=_dict(data["analysis"]),
        retries=_int(data["retries"]),
        timings=_dict(data["timings"]),
        prepared=None if prepared is None else _prepared_from_data(prepared),
    )


def attempt_from_data(data: Any) -> AttemptRecord:
    """An :class:`AttemptRecord` from its JSON form; raises like the converter."""
    try:
        return _attempt_fast(data)
    except (_Unexpected, KeyError, TypeError, ValueError):
        return converter.structure(data, AttemptRecord)


def task_from_data(data: Any) -> TaskRecord:
    """A :class:`TaskRecord` from its JSON form; raises like the converter."""
    try:
        data = _dict(data)
        _keys(data, 4)
        return TaskRecord(
            task_id=_str(data["task_id"]),
            category=_opt_str(data["category"]),
            attempts=[_attempt_fast(a) for a in _list(data["attempts"])],
            severity=_in(data["severity"], _TASK_SEVERITIES),
        )
    except (_Unexpected, KeyError, TypeError, ValueError):
        return converter.structure(data, TaskRecord)
