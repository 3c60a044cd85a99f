"""load_run on directories a SIGKILL interrupted."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agentcompass._store import load_run, task_key
from agentcompass.runtime import AttemptRecord, TaskRecord
from agentcompass.runtime._convert import unstructure


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
    # What reap reads: the journal and run_info.json, no record.
    journal_only = load_run(run, records=False)
    assert (journal_only.details, journal_only.checkpoints) == ({}, {})
    assert journal_only.open_sessions == loaded.open_sessions and journal_only.run_info == loaded.run_info
    assert ["line 4 of sessions.jsonl" in note for note in journal_only.notes] == [True]


def two_records_of_t1(run_dir: Path) -> Path:
    """An old ``fatal`` and a new ``normal`` record of ``t1`` (a crash between
    writing one and removing the other); returns the new one's path."""
    old = run_dir / "details" / "fatal" / "t1.json"
    new = run_dir / "details" / "normal" / "t1.json"
    write(old, record("t1", "fatal", 0.0))
    write(new, record("t1", "normal", 1.0))
    os.utime(old, ns=(1_000_000_000, 1_000_000_000))
    return new


def test_newest_record_wins_and_stale_checkpoints_are_ignored(tmp_path: Path) -> None:
    # A crash between writing the new record and removing the old one (and
    # the superseded checkpoint).
    two_records_of_t1(tmp_path)
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


def test_keep_files_gives_each_record_its_file_and_bytes(tmp_path: Path) -> None:
    old = tmp_path / "details" / "fatal" / "t1.json"
    new = tmp_path / "details" / "normal" / "t1.json"
    write(old, record("t1", "fatal", 0.0))
    write(new, record("t1", "normal", 1.0))
    write(tmp_path / "details" / "error" / "t2.json", record("t2", "error"))
    os.utime(old, ns=(1_000_000_000, 1_000_000_000))
    loaded = load_run(tmp_path, keep_files=True)
    assert loaded.files == {
        "t1": (str(new), new.read_bytes()),  # the newest, as in details
        "t2": (str(tmp_path / "details" / "error" / "t2.json"), (tmp_path / "details" / "error" / "t2.json").read_bytes()),
    }
    assert load_run(tmp_path).files == {}


def test_a_newer_record_read_first_still_wins(tmp_path: Path) -> None:
    newer = tmp_path / "details" / "fatal" / "t1.json"
    older = tmp_path / "details" / "normal" / "t1.json"
    write(newer, record("t1", "fatal", 0.0))
    write(older, record("t1", "normal", 1.0))
    os.utime(older, ns=(1_000_000_000, 1_000_000_000))
    assert load_run(tmp_path).details == {"t1": record("t1", "fatal", 0.0)}


def test_journal_lines_are_read_one_by_one(tmp_path: Path) -> None:
    lines = [
        json.dumps({"event": "opened", "session": "a", "provider": "p", "handle": {"id": "a"}}),
        '{"event": "opened", "session": "b", "provider": "p"}, {"event": "closed"}',  # two values
        "[1",  # with the next line, one JSON value: still two unreadable lines
        "2]",
        json.dumps({"event": "opened", "session": "c", "provider": "p", "handle": {"id": "c"}}),
        json.dumps({"event": "closed", "session": "a", "provider": "p", "handle": {"id": "a"}}),
    ]
    (tmp_path / "sessions.jsonl").write_text("\n".join(lines) + "\n")
    loaded = load_run(tmp_path)
    assert loaded.open_sessions == [("c", "p", {"id": "c"})]
    notes = "\n".join(loaded.notes)
    for number in (2, 3, 4):
        assert f"line {number} of sessions.jsonl" in notes
