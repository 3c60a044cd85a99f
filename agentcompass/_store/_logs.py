"""Log files a benchmark keeps with an attempt (SPEC 8: ``tasks/<task key>/attempt-<n>/logs/``).

A benchmark hands them over as ``run_result.artifacts["logs"]``, a mapping of
relative path to bytes (``terminal``: what the verifier and the agent left in
``/logs/verifier`` and ``/logs/agent``). The driver takes the bytes out of the
record before it is kept or written, writes them as files of their own, and
leaves in the record the kept paths with their sizes. The paths come from a
session, so they are hostile: only plain relative paths of ordinary names are
written, at most :data:`MAX_LOG_BYTES` per attempt.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from ..runtime._results import AttemptRecord, TaskRecord

__all__ = ["MAX_LOG_BYTES", "take_logs", "take_task_logs"]

#: What is kept per attempt, at most (SPEC 10).
MAX_LOG_BYTES = 16 * 1024 * 1024
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+@=,-]{0,127}")
_MAX_DEPTH = 8


def take_logs(record: AttemptRecord) -> tuple[AttemptRecord, dict[str, bytes]]:
    """``record`` without the bytes of its kept logs (their sizes instead), and the files to write."""
    result = record.run_result
    logs = result.artifacts.get("logs") if result is not None else None
    if result is None or not isinstance(logs, dict) or not any(isinstance(v, (bytes, bytearray)) for v in logs.values()):
        return record, {}
    files: dict[str, bytes] = {}
    listed: dict[str, Any] = {}
    budget = MAX_LOG_BYTES
    for rel, content in logs.items():
        if not isinstance(content, (bytes, bytearray)):
            listed[str(rel)] = content
            continue
        path = _safe(rel)
        if path is None or len(content) > budget:
            continue
        files[path] = bytes(content)
        listed[path] = len(content)
        budget -= len(content)
    artifacts = {**result.artifacts, "logs": listed}
    return attrs.evolve(record, run_result=attrs.evolve(result, artifacts=artifacts)), files


def take_task_logs(record: TaskRecord) -> tuple[TaskRecord, dict[int, dict[str, bytes]]]:
    """:func:`take_logs` for every attempt of ``record``: the record and the files by attempt."""
    attempts = []
    files: dict[int, dict[str, bytes]] = {}
    for attempt in record.attempts:
        attempt, taken = take_logs(attempt)
        attempts.append(attempt)
        if taken:
            files[attempt.attempt] = taken
    return (attrs.evolve(record, attempts=attempts) if files else record), files


def _safe(rel: Any) -> str | None:
    """``rel`` if it is a relative path of ordinary names, else None."""
    if not isinstance(rel, str):
        return None
    parts = rel.split("/")
    if len(parts) > _MAX_DEPTH or not all(_PART.fullmatch(part) for part in parts):
        return None
    return rel
