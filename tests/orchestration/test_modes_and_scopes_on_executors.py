"""Evaluation modes and retry scopes (SPEC sections 5 and 6), on both executors.

One test body each, run by a real ``compass launch`` in process and on the
session's Ray cluster of 2 workers (the ``executor`` fixture). The stages
journal which Environment session they ran in (``_executor_runs``), so
the same assertions hold wherever the attempt ran: in ``reuse`` mode
evaluation runs in the run's session; in ``fresh`` mode in a new session,
opened once the task's session closed; in ``none`` mode without one, after
the task's session closed. A FATAL retried reruns what SPEC 6 says: setup,
run or a ``reuse`` evaluation the whole attempt in a new session; a
``none`` evaluation only ``evaluate``; a ``fresh`` evaluation only the
evaluation session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _common import only_run_dir, read_json, read_jsonl
from _executor_runs import journal, launch, rec_request
from _ray_support import RayCluster

MODES = ("reuse", "none", "fresh")
FAST_RETRY = {"max_retries": 1, "retry_min_delay_seconds": 0.01, "retry_max_delay_seconds": 0.02}


def _stages(lines: list[list[str]], task: str) -> list[tuple[str, str]]:
    """``(stage, session)`` of the task's prepare, run and evaluate calls, in order."""
    return [(f[0], f[1]) for f in lines if f[0] in ("prepare", "run", "evaluate") and f[3] == task]


def _at(lines: list[list[str]], event: str, session: str, task: str | None = None) -> int:
    """The position of the only ``event`` line of ``session`` (and ``task``)."""
    [index] = [i for i, f in enumerate(lines) if f[:2] == [event, session] and (task is None or f[3] == task)]
    return index


def _record(run_dir: Path, task: str) -> dict[str, Any]:
    [record] = [r for r in (read_json(p) for p in run_dir.glob("details/*/*.json")) if r["task_id"] == task]
    return record


def _discarded(run_dir: Path, task: str) -> list[dict[str, Any]]:
    return [read_json(p) for p in sorted(run_dir.glob(f"tasks/{task}/attempt-0/retries/*.json"))]


def _sessions(run_dir: Path) -> tuple[set[str], set[str]]:
    lines = read_jsonl(run_dir / "sessions.jsonl")
    opened = {line["session"] for line in lines if line["event"] == "opened"}
    return opened, {line["session"] for line in lines if line["event"] == "closed"}


def _ran_where(lines: list[list[str]], executor: RayCluster | None, driver: int) -> None:
    """The stages ran in the driver in process, in the 2 workers on Ray."""
    pids = {int(f[2]) for f in lines if f[0] in ("prepare", "run")}
    if executor is None:
        assert pids == {driver}
    else:
        assert driver not in pids and len(pids) == 2, pids


def test_each_evaluation_mode_evaluates_in_the_session_spec_5_says(
    tmp_path: Path, executor: RayCluster | None
) -> None:
    tasks = {mode: [f"{mode}{i}" for i in range(2)] for mode in MODES}
    config = {
        "orchestration": {"task_concurrency": 6, "cleanup_grace_seconds": 5},
        "requests": [
            rec_request(tmp_path, mode, tasks[mode], benchmark={"plan": {"evaluation_environment_mode": mode}})
            for mode in MODES
        ],
    }
    done = launch(tmp_path, config, executor)
    assert done.returncode == 0, done.stderr

    lines = journal(tmp_path)
    _ran_where(lines, executor, done.pid)
    for mode in MODES:
        run_dir = only_run_dir(tmp_path / "out", mode)
        assert read_json(run_dir / "run_info.json")["status"] == "succeeded"
        opened, closed = _sessions(run_dir)
        assert opened == closed and len(opened) == (4 if mode == "fresh" else 2), (mode, opened)
        for task in tasks[mode]:
            [attempt] = _record(run_dir, task)["attempts"]
            assert attempt["status"] == "completed" and attempt["values"] == {"score": 1.0}
            [(_, task_env), (_, ran_in), (_, evaluated_in)] = _stages(lines, task)
            assert ran_in == task_env
            task_closed = _at(lines, "close", task_env)
            evaluated = _at(lines, "evaluate", evaluated_in, task)
            if mode == "reuse":
                # In the run's own session, before it closes.
                assert evaluated_in == task_env and evaluated < task_closed
            elif mode == "fresh":
                # A new session, opened after the task's closed, closed after evaluation.
                assert evaluated_in not in (task_env, "-")
                assert task_closed < _at(lines, "open", evaluated_in) < evaluated < _at(lines, "close", evaluated_in)
            else:
                # No Environment, after the task's closed.
                assert evaluated_in == "-" and task_closed < evaluated
    assert list((tmp_path / "sandboxes").iterdir()) == []


def test_a_fatal_retry_reruns_what_spec_6_says_per_stage_and_mode(
    tmp_path: Path, executor: RayCluster | None
) -> None:
    def request(name: str, mode: str, **parts: Any) -> dict[str, Any]:
        benchmark = {"plan": {"evaluation_environment_mode": mode}, **parts.pop("benchmark", {})}
        return rec_request(tmp_path, name, [name], benchmark=benchmark, execution=FAST_RETRY, **parts)

    config = {
        "orchestration": {"task_concurrency": 6, "cleanup_grace_seconds": 5},
        "requests": [
            request("setup", "fresh", benchmark={"script": {"*": {"prepare": ["fatal"]}}}),
            request("run", "none", harness={"crash": {"run": ["fatal"]}}),
            request("evalreuse", "reuse", benchmark={"script": {"*": {"evaluate": ["fatal"]}}}),
            request("evalnone", "none", benchmark={"script": {"*": {"evaluate": ["fatal"]}}}),
            request("evalfresh", "fresh", benchmark={"script": {"*": {"evaluate": ["fatal"]}}}),
            # The budget (one retry) is spent: the FATAL stays.
            request("spent", "reuse", benchmark={"script": {"*": {"prepare": ["fatal", "fatal"]}}}),
        ],
    }
    done = launch(tmp_path, config, executor)
    assert done.returncode == 1, done.stderr
    lines = journal(tmp_path)
    _ran_where(lines, executor, done.pid)

    # stage retried, scope, the stages journalled: (stage, which session) with
    # sessions numbered in order of appearance (0: the first task session).
    expected = {
        "setup": ("setup", "attempt", ["prepare 0", "prepare 1", "run 1", "evaluate 2"]),
        "run": ("run", "attempt", ["prepare 0", "run 0", "prepare 1", "run 1", "evaluate -"]),
        "evalreuse": ("evaluate", "attempt", ["prepare 0", "run 0", "evaluate 0", "prepare 1", "run 1", "evaluate 1"]),
        "evalnone": ("evaluate", "evaluation", ["prepare 0", "run 0", "evaluate -", "evaluate -"]),
        "evalfresh": (
            "evaluate", "evaluation_environment", ["prepare 0", "run 0", "evaluate 1", "evaluate 2"]
        ),
        "spent": ("setup", "attempt", ["prepare 0", "prepare 1"]),
    }
    for name, (stage, scope, stages) in expected.items():
        run_dir = only_run_dir(tmp_path / "out", name)
        numbers: dict[str, str] = {"-": "-"}
        seen = [f"{event} {numbers.setdefault(session, str(len(numbers) - 1))}" for event, session in _stages(lines, name)]
        assert seen == stages, (name, seen)
        [discarded] = _discarded(run_dir, name)
        assert (discarded["stage"], discarded["scope"], discarded["retry_number"]) == (stage, scope, 1), name
        assert discarded["issues"][0]["severity"] == "fatal"
        [attempt] = _record(run_dir, name)["attempts"]
        assert attempt["retries"] == 1, name
        opened, closed = _sessions(run_dir)
        assert opened == closed and len(opened) == len(set(numbers) - {"-"}), name
        info = read_json(run_dir / "run_info.json")
        if name == "spent":
            assert attempt["status"] == "run_error" and info["status"] == "failed"
            assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("fatal", "fake_prepare_fatal")]
        else:
            assert attempt["status"] == "completed" and info["status"] == "succeeded", name
    assert list((tmp_path / "sandboxes").iterdir()) == []
