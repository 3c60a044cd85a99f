"""The SDK's reader of a run directory: ``agentcompass.read_run``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from ._store._layout import RunLayout
from ._store._load import load_run
from .runtime._results import AttemptRecord, TaskRecord

__all__ = ["StoredRun", "read_run"]


@attrs.frozen
class StoredRun:
    """A run directory as read back (see :func:`read_run`).

    ``records`` are the countable task records (task id -> record);
    ``checkpoints`` the evaluated attempts of tasks that have no record yet
    (an interrupted run); ``metrics`` the content of ``metrics.json`` (None
    when the run did not finalize); ``notes`` what the reader had to skip
    and why. ``undetermined`` are tasks whose record was read but whose
    severity cannot be determined (task id -> file and reason): they are
    not in ``records`` and a ``--reuse`` runs them again.
    """

    run_dir: Path
    run_info: dict[str, Any]
    records: dict[str, TaskRecord]
    checkpoints: dict[str, dict[int, AttemptRecord]]
    metrics: dict[str, Any] | None
    notes: list[str]
    undetermined: dict[str, str]


def read_run(run_dir: str | Path) -> StoredRun:
    """Read a run directory written by this or any other version of the
    runtime (blocking: from async code, call it in a worker thread).

    Results are read leniently and by their format (SPEC 12): a key this
    version does not know is ignored, never a reason to skip a record; a
    file written by an earlier format is converted. A file that cannot be
    read at all is named in ``notes``."""
    loaded = load_run(Path(run_dir))
    try:
        metrics = json.loads(Path(RunLayout(run_dir).metrics).read_bytes())
    except (OSError, ValueError):
        metrics = None
    return StoredRun(
        run_dir=loaded.run_dir,
        run_info=loaded.run_info,
        records=dict(loaded.details),
        checkpoints=dict(loaded.checkpoints),
        metrics=metrics if isinstance(metrics, dict) else None,
        notes=list(loaded.notes),
        undetermined=dict(loaded.undetermined),
    )
