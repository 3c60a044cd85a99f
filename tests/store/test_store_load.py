"""load_run on directories a SIGKILL interrupted."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agentcompass._convert import unstructure
from agentcompass._store import load_run, task_key
from agentcompass.runtime import AttemptRecord, TaskRecord


def record(task_id: str, severity: str, value: float = 1.0) -> TaskRecord:
    attempt = AttemptRecord(attempt=0, status="completed", values={"acc": value})
    return TaskRecord(task_id, None, [attempt], severity)  # type: ignore[arg-type]


def write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(unstructure(data)))


def test_load_run_tolerates_crash_leftovers(tmp_path: Path) -> None:
    run = tmp_path
    write(run / "run_info.json", {"status": "running"})
    write(run / "details" / "normal" / "t1.json", record("t1", "normal"))
    (run / "details" / "normal" / ".t2.json.123-0.tmp").write_text('{"task_id": "t2", "cut')
    (run / "details" / "error").mkdir()
    (run / "details" / "error" / "broken.json").write_text("{not json")
    ckpt = run / "tasks" / task_key("T 2") / "attempt-0" / "checkpoint.json"
    write(ckpt, {"task_id": "T 2", "record": record("T 2", "normal").attempts[0]})
    (ckpt.parent / ".checkpoint.json.9-9.tmp").write_text("partial")
    (run / "tasks" / "x" / "attempt-0").mkdir(parents=True)
    (run / "tasks" / "x" / "attempt-0" / "checkpoint.json").write_text('{"task_id": 3}')
    (run / "tasks" / "y" / "attempt-0" / "retries").mkdir(parents=True)  # only a discarded try
    sessions = [
        {"event": "opened", "session": "a", "provider": "docker", "handle": {"id": "a"}, "t": 1},
        {"event": "opened", "session": "b", "provider": "k8s", "handle": {"pod": "b"}, "t": 2},
        {"event": "closed", "session": "a", "provider": "docker", "handle": {"id": "a"}, "t": 3},
    ]
    text = "".join(json.dumps(s) + "\n" for s in sessions) + '{"event": "opened", "sess'
    (run / "sessions.jsonl").write_text(text)

    loaded = load_run(run)
    assert loaded.run_info == {"status": "running"}
    assert loaded.details == {"t1": record("t1", "normal")}
    assert loaded.checkpoints == {"T 2": {0: record("T 2", "normal").attempts[0]}}
    assert loaded.open_sessions == [("b", "k8s", {"pod": "b"})]
    notes = "\n".join(loaded.notes)
    assert "details/error/broken.json" in notes
    assert "tasks/x/attempt-0/checkpoint.json" in notes
    assert "line 4 of sessions.jsonl" in notes


def test_newest_record_wins_and_stale_checkpoints_are_ignored(tmp_path: Path) -> None:
    # A crash between writing the new record and removing the old one (and
    # the superseded checkpoint).
    old = tmp_path / "details" / "fatal" / "t1.json"
    new = tmp_path / "details" / "normal" / "t1.json"
    write(old, record("t1", "fatal", 0.0))
    write(new, record("t1", "normal", 1.0))
    os.utime(old, ns=(1_000_000_000, 1_000_000_000))
    write(
        tmp_path / "tasks" / "t1" / "attempt-0" / "checkpoint.json",
        {"task_id": "t1", "record": record("t1", "normal").attempts[0]},
    )
    loaded = load_run(tmp_path)
    assert loaded.details == {"t1": record("t1", "normal", 1.0)}
    assert loaded.checkpoints == {}
    assert any("two severities" in note for note in loaded.notes)


def test_empty_directory(tmp_path: Path) -> None:
    loaded = load_run(tmp_path)
    assert (loaded.details, loaded.checkpoints, loaded.open_sessions) == ({}, {}, [])
    assert loaded.notes == ["run_info.json is missing"]
