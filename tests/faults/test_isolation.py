"""Failure isolation (SPEC section 7): an error no row of section 6
classifies fails its own request - status ``failed``, the error in
``run_info.json`` and on the console as one line - and never another
request or the process."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
from _common import only_run_dir, read_json, read_jsonl
from _executor_runs import journal, launch, rec_request
from _ray_support import RayCluster

import agentcompass
from agentcompass import ExecutionSpec, Orchestration
from agentcompass.testing import call_log, fake_request

BENCH = {
    "tasks": 2,
    "plan": {"evaluation_environment_mode": "fresh", "evaluation_network_policy": {"mode": "none"}},
    "script": {"t000": {"evaluate": ["fatal"]}},
}


def _run_info(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "run_info.json").read_text())


async def test_a_provider_rejecting_a_resumed_attempts_plan_fails_only_its_request(
    tmp_path: Path
) -> None:
    a = fake_request("a", log="a", benchmark=BENCH, output_root=tmp_path)
    first = await agentcompass.launch(Orchestration([a]))
    assert first.requests[0].status == "failed"  # t000's evaluation: FATAL
    # Resumed with a retry: only t000's evaluation runs again, in a fresh
    # Environment, but the provider now rejects the plan's evaluation policy.
    resumed = attrs.evolve(
        a,
        environment=attrs.evolve(a.environment, config={"log": "a", "policies": ["full"]}),
        execution=ExecutionSpec(max_retries=1),
        reuse=True,
    )
    b = fake_request("b", log="b", benchmark={"tasks": 3}, output_root=tmp_path)

    result = await agentcompass.launch(Orchestration([resumed, b], task_concurrency=2))

    statuses = {r.name: r.status for r in result.requests}
    assert statuses == {"a": "failed", "b": "succeeded"}
    assert result.status == "partial_failure" and result.exit_code == 1
    info = _run_info(result.requests[0].run_dir)
    assert info["status"] == "failed"
    assert "ComponentError" in info["error"] and "cannot enforce network policy 'none'" in info["error"]
    assert "\n" not in info["error"]
    assert any("ComponentError" in note for note in info["notes"])
    assert call_log("b").count("run") == 3
    assert not call_log("a").live_sessions() and not call_log("b").live_sessions()


# -- the same on both executors: real ``compass launch`` runs -------------------------

BENCH_A = {
    "plan": {"evaluation_environment_mode": "fresh", "evaluation_network_policy": {"mode": "none"}},
    "script": {"a0": {"evaluate": ["fatal"]}},
}


def test_a_failing_request_never_affects_the_others(tmp_path: Path, executor: RayCluster | None) -> None:
    """In process and on Ray, in one run: a resumed attempt whose plan the
    provider now rejects (an error no row of SPEC 6 classifies, raised where
    the task runs, a Ray worker) fails its request; a provider that cannot
    open and a harness that crashes fail theirs with FATAL issues; a
    benchmark whose ``aggregate_metrics`` raises keeps the standard metrics
    with a note; the request beside them runs as if alone."""

    def a(**changes: object) -> dict:
        request = rec_request(tmp_path, "a", ["a0", "a1"], benchmark=BENCH_A, execution=changes.pop("execution", {}))
        request["environment"] = {"id": "fake-env", "config": changes.pop("environment", {})}
        return {**request, **changes}

    # The run to resume (in process: it only leaves a0's failed evaluation on disk).
    first = launch(tmp_path, {"requests": [a()]}, None, name="first")
    assert first.returncode == 1, first.stderr
    not_a_directory = tmp_path / "not-a-directory"
    not_a_directory.write_text("")
    config = {
        "orchestration": {"task_concurrency": 4, "cleanup_grace_seconds": 5},
        "requests": [
            a(environment={"policies": ["full"]}, execution={"max_retries": 1}, reuse=True),
            rec_request(tmp_path, "broken", ["broken0", "broken1"], environment={"root": str(not_a_directory)}),
            rec_request(tmp_path, "crash", ["crash0", "crash1"], harness={"crash": {"crash0": ["raise"]}}),
            rec_request(tmp_path, "ok", ["ok0", "ok1", "ok2"]),
            rec_request(tmp_path, "aggregate", ["aggregate0"], benchmark={"aggregate_fails": True}),
        ],
    }
    done = launch(tmp_path, config, executor)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr

    [_, resumed] = sorted((tmp_path / "out" / "a").iterdir())
    infos = {name: _run_info(str(only_run_dir(tmp_path / "out", name))) for name in ("broken", "crash", "ok", "aggregate")}
    infos["a"] = _run_info(str(resumed))
    assert {name: info["status"] for name, info in infos.items()} == {
        "a": "failed", "broken": "failed", "crash": "failed", "ok": "succeeded", "aggregate": "succeeded",
    }
    error = infos["a"]["error"]
    assert "ComponentError" in error and "cannot enforce network policy 'none'" in error and "\n" not in error
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("error: a: request failed: ")]
    assert "cannot enforce network policy 'none'" in line
    assert "aggregate_metrics failed: RuntimeError: aggregate_metrics failed on purpose" in infos["aggregate"]["notes"]

    def attempts(name: str) -> dict[str, dict]:
        run_dir = only_run_dir(tmp_path / "out", name)
        return {r["task_id"]: r["attempts"][0] for r in (read_json(p) for p in run_dir.glob("details/*/*.json"))}

    codes = {task: [(i["severity"], i["code"]) for i in a["issues"]] for task, a in attempts("broken").items()}
    assert codes == {f"broken{i}": [("fatal", "environment_failed")] for i in range(2)}
    crash = attempts("crash")
    assert [(i["severity"], i["code"]) for i in crash["crash0"]["issues"]] == [("fatal", "harness_crashed")]
    assert crash["crash1"]["status"] == "completed"
    ok = attempts("ok")
    assert sorted(ok) == ["ok0", "ok1", "ok2"] and all(a["status"] == "completed" for a in ok.values())
    # Each agent ran once per task (a's in the first run only), and every
    # sandbox opened was closed.
    runs = [line.split()[0] for line in (tmp_path / "runs.txt").read_text().splitlines()]
    assert sorted(runs) == ["a0", "a1", "aggregate0", "crash0", "crash1", "ok0", "ok1", "ok2"]
    lines = journal(tmp_path)
    assert sorted(f[1] for f in lines if f[0] == "opened") == sorted(f[1] for f in lines if f[0] == "close")
    # Each request's sessions are in its own journal, and only they.
    for name in ("crash", "ok", "aggregate"):
        sessions = read_jsonl(only_run_dir(tmp_path / "out", name) / "sessions.jsonl")
        journalled = {line["name"] for line in sessions if line["event"] == "opened"}
        assert journalled == {f[1] for f in lines if f[0] == "prepare" and f[3].startswith(name)}, name
    assert list((tmp_path / "sandboxes").iterdir()) == []
