"""Results outlive a version (SPEC 12): a run directory of this release's
format (the committed fixture, which must stay readable forever) and a
record written by a "newer" version (a later format, keys this version
does not know) are read by every reader: ``compass show``, the viewer, the
SDK and ``--reuse``. Unknown keys survive a reuse copy byte for byte, and
nothing that finished runs again. A record whose severity cannot be
determined runs again, counted in one line; a file that cannot be read at
all is a WARNING naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import structlog
import trio

import agentcompass
from agentcompass import ExecutionSpec, Orchestration
from agentcompass._report._show import render_overview, run_overview
from agentcompass._store._layout import RunLayout
from agentcompass._view._data import RunData
from agentcompass.testing import call_log, fake_request

FIXTURE = Path(__file__).with_name("fixtures") / "format-1" / "fixture"
NEWER = {"cost_usd": 0.42, "verdict": {"by": "judge-v9", "scores": [1, 2]}}


def _request(output_root: Path, source: Path, **execution: Any) -> Any:
    """The fixture's experiment (as ``tests/store/fixtures/format-1`` was made), reusing ``source``."""
    return fake_request(
        "fixture", log="fixture", benchmark={"tasks": 5}, output_root=output_root, reuse=source,
        environment={"script": {"t002": {"open": ["fatal", "fatal"]}, "t003": {"open": ["fatal"]}}},
        harness={"script": {"t001": {"run": ["harness_timeout"]}}},
        execution=ExecutionSpec(max_retries=0, retry_min_delay_seconds=0.01, retry_max_delay_seconds=0.02, **execution),
    )  # fmt: skip


def _copy_fixture(tmp_path: Path) -> tuple[Path, RunLayout]:
    (source,) = FIXTURE.iterdir()
    run_dir = tmp_path / "old" / "fixture" / source.name
    shutil.copytree(source, run_dir)
    return run_dir, RunLayout(run_dir)


def _make_newer(layout: RunLayout) -> bytes:
    """t003's record and t004's checkpoint as a later format writes them: unknown keys at every level."""
    path = Path(layout.record("normal", "t003"))
    record = json.loads(path.read_bytes())
    record.update(format=2, **NEWER)
    record["attempts"][0]["reasoning_effort"] = "high"
    record["attempts"][0]["run_result"]["usage"]["cost_usd"] = 0.42  # a free-form dict: kept anyway
    record["attempts"][0]["run_result"]["trajectory_format"] = "ATIF-v1.4"
    newer = json.dumps(record, indent=1).encode()
    path.write_bytes(newer)
    checkpoint_path = Path(layout.checkpoint("t004", 0))
    checkpoint = json.loads(checkpoint_path.read_bytes())
    checkpoint["format"] = 2
    checkpoint["record"]["reasoning_effort"] = "low"
    checkpoint["record"]["issues"] = [{"severity": "warning", "phase": "run", "code": "w", "message": "m", "hint": "x"}]
    checkpoint_path.write_text(json.dumps(checkpoint))
    return newer


def test_every_reader_reads_the_fixture_and_a_newer_record(tmp_path: Path) -> None:
    run_dir, layout = _copy_fixture(tmp_path)
    _make_newer(layout)

    # compass show
    loaded, view = run_overview(run_dir)
    assert sorted(loaded.details) == ["t000", "t001", "t002", "t003"] and sorted(loaded.checkpoints) == ["t004"]
    assert {t: r.severity for t, r in loaded.details.items()} == {
        "t000": "normal", "t001": "error", "t002": "fatal", "t003": "normal"}  # fmt: skip
    assert loaded.unreadable == [] and loaded.undetermined == {}
    assert view["tasks"] == {"total": 5, "finished": 4, "unfinished": 1, "invalidated": 1, "error": 1, "normal": 2}
    assert "t003" in render_overview(loaded, view)
    assert loaded.checkpoints["t004"][0].issues[0].code == "w"

    # the viewer (plain JSON, every key shown)
    data = RunData(run_dir).run()
    assert sorted(row[0] for row in data["tasks"]) == ["t000", "t001", "t002", "t003"]
    task = RunData(run_dir).task("t003")
    assert task is not None and task["attempts"][0]["reasoning_effort"] == "high"
    assert RunData(run_dir).task("t002")["discarded"][0]["data"]["retry_delay_seconds"] > 0  # type: ignore[index]

    # the SDK
    stored = agentcompass.read_run(run_dir)
    assert sorted(stored.records) == ["t000", "t001", "t002", "t003"] and list(stored.checkpoints) == ["t004"]
    assert stored.records["t003"].attempts[0].values == {"score": 1.0}
    assert stored.metrics is not None and stored.metrics["series"]["score"]["invalidated"] == 1


def test_reuse_of_the_fixture_and_a_newer_record_reruns_nothing_and_keeps_unknown_keys(tmp_path: Path) -> None:
    run_dir, layout = _copy_fixture(tmp_path)
    newer = _make_newer(layout)
    request = _request(tmp_path / "new", run_dir)

    result = trio.run(agentcompass.launch, Orchestration([request]))
    new_dir = Path(result.requests[0].run_dir)
    new = RunLayout(new_dir)
    # Nothing that finished ran again (t004 finished as a checkpoint).
    assert [c for c in call_log("fixture").calls if c.component == "harness" or c.phase == "open"] == []
    events = [json.loads(line) for line in Path(new.progress_lines).read_text().splitlines()]
    assert [e.get("task") for e in events if e["event"] == "task_started"] == ["t004"]  # its checkpoint finishes it
    assert not [e for e in events if e["event"] == "attempt_started"]
    # The newer record is copied byte for byte; the others too.
    assert Path(new.record("normal", "t003")).read_bytes() == newer
    for severity, task_id in (("normal", "t000"), ("error", "t001"), ("fatal", "t002")):
        assert Path(new.record(severity, task_id)).read_bytes() == Path(layout.record(severity, task_id)).read_bytes()
    # The checkpoint's unknown keys are kept in the record made from it.
    t004 = json.loads(Path(new.record("normal", "t004")).read_bytes())
    assert t004["format"] == 1 and t004["attempts"][0]["reasoning_effort"] == "low"
    assert t004["attempts"][0]["issues"][0]["hint"] == "x"
    info = json.loads(Path(new.run_info).read_bytes())
    assert info["format"] == 1 and not any("run again" in note for note in info.get("notes", []))


def test_an_undetermined_record_runs_again_counted_once_and_an_unreadable_file_is_a_warning(tmp_path: Path) -> None:
    run_dir, layout = _copy_fixture(tmp_path)
    # t001: an issue of a severity this version does not know; t000: not JSON at all.
    path = Path(layout.record("error", "t001"))
    record = json.loads(path.read_bytes())
    record["attempts"][0]["issues"][0]["severity"] = "critical"
    path.write_text(json.dumps(record))
    Path(layout.record("normal", "t000")).write_bytes(b"\x00not json")

    loaded = agentcompass.read_run(run_dir)
    assert sorted(loaded.records) == ["t002", "t003"]
    assert list(loaded.undetermined) == ["t001"] and "details/error/t001.json" in loaded.undetermined["t001"]
    assert any("details/normal/t000.json" in note for note in loaded.notes)

    # The events as logged (the run's log.jsonl holds them only where no
    # earlier code of this process configured structlog its own way).
    with structlog.testing.capture_logs() as events:
        result = trio.run(agentcompass.launch, Orchestration([_request(tmp_path / "new", run_dir)]))
    new_dir = Path(result.requests[0].run_dir)
    ran = sorted({c.task_id for c in call_log("fixture").calls if c.component == "harness"})
    assert ran == ["t000", "t001"]
    notes = json.loads(Path(RunLayout(new_dir).run_info).read_bytes())["notes"]
    counted = [n for n in notes if "run again" in n]
    assert len(counted) == 1 and counted[0].startswith("reuse: 1 task(s) run again")
    [warning] = [e for e in events if e.get("event") == "reuse_unreadable_file"]
    assert warning["log_level"] == "warning" and warning["file"].endswith("details/normal/t000.json")


def test_a_record_without_severity_takes_its_issues_worst_and_old_retry_files_are_read(tmp_path: Path) -> None:
    run_dir, layout = _copy_fixture(tmp_path)
    for severity, task_id in (("error", "t001"), ("fatal", "t002")):
        path = Path(layout.record(severity, task_id))
        record = json.loads(path.read_bytes())
        del record["severity"], record["format"]
        path.write_text(json.dumps(record))
    retry = Path(layout.retry("t002", 0, 1))
    data = json.loads(retry.read_bytes())
    data["delay_seconds"] = data.pop("retry_delay_seconds")
    del data["format"]
    retry.write_text(json.dumps(data))
    stored = agentcompass.read_run(run_dir)
    assert (stored.records["t001"].severity, stored.records["t002"].severity) == ("error", "fatal")
    [discarded] = RunData(run_dir).task("t002")["discarded"]  # type: ignore[index]
    assert discarded["data"]["retry_delay_seconds"] == data["delay_seconds"]
