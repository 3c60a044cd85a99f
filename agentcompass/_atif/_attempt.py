"""The ATIF document of one attempt record (``agent/trajectory.json``)."""

from __future__ import annotations

from typing import Any

from ..runtime._results import AttemptRecord
from ..runtime._values import RunRequest
from ._build import to_atif

__all__ = ["atif_of"]


def atif_of(request: RunRequest, task_id: str, record: AttemptRecord, run_id: str) -> dict[str, Any] | None:
    """The attempt's trajectory in ATIF; None when no harness ran it (a
    harness-free benchmark), it has no run result, or its harness recorded
    no step (a document of no steps would say nothing the record does not)."""
    plan, result = record.plan, record.run_result
    harness = request.harness.id if plan is None else plan.harness.id
    if harness == "none" or result is None or not isinstance(result.trajectory, list) or not result.trajectory:
        return None
    from .. import __version__

    agent = result.artifacts.get("agent") if isinstance(result.artifacts, dict) else None
    name, version = harness, __version__
    if isinstance(agent, dict) and isinstance(agent.get("id"), str):
        name, version = agent["id"], str(agent.get("version") or version)
    return to_atif(
        result.trajectory,
        session_id=f"{run_id}/{task_id}/attempt-{record.attempt}",
        agent=name,
        agent_version=version,
        model_name=request.model.name if request.model is not None else None,
        usage=result.usage or None,
        extra={
            "runtime": "agentcompass",
            "harness": harness,
            "task_id": task_id,
            "attempt": record.attempt,
            "status": record.status,
            "issues": [{"severity": i.severity, "code": i.code} for i in record.issues],
        },
    )
