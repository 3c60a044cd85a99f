"""Harbor tasks under ``sandbox``: the bundled terminal smoke tasks score the
same as under ``local`` with no network while the agent runs, and a task
whose ``environment/`` holds a Dockerfile is flagged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _sandbox_support import census, requires_sandbox

REPO = Path(__file__).resolve().parents[3]
SMOKE = REPO / "benchmarks_data" / "terminal-smoke"


def _launch(
    tmp_path: Path, name: str, environment: str, tasks: Path, execution: str = "{}", benchmark: str = ""
) -> dict[str, dict]:  # type: ignore[type-arg]
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        "orchestration: {task_concurrency: 4}\n"
        "requests:\n"
        f"  - name: {name}\n"
        f"    benchmark: {{id: terminal, config: {{path: {tasks}{benchmark}}}}}\n"
        "    harness: {id: oracle}\n"
        f"    environment: {{id: {environment}}}\n"
        f"    execution: {execution}\n"
    )
    compass = str(Path(sys.executable).with_name("compass"))
    done = subprocess.run(
        [compass, "launch", str(config), "--output-root", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    records = {}
    for path in (tmp_path / "runs" / name).glob("*/details/*/*.json"):
        record = json.loads(path.read_text())
        records[record["task_id"]] = record
    return records


def _outcome(record: dict) -> tuple:  # type: ignore[type-arg]
    (attempt,) = record["attempts"]
    return (attempt["values"], [issue["code"] for issue in attempt["issues"]])


@requires_sandbox
async def test_terminal_smoke_scores_the_same_as_local_with_run_none(tmp_path: Path) -> None:
    local = _launch(tmp_path, "smoke-local", "local", SMOKE)
    sandboxed = _launch(tmp_path, "smoke-sandbox", "sandbox", SMOKE, "{network: {run: none}}")
    assert len(local) == 12
    passing = {task for task, record in local.items() if _outcome(record)[0].get("passed")}
    assert len(passing) >= 10
    assert {task: _outcome(r) for task, r in sandboxed.items()} == {task: _outcome(r) for task, r in local.items()}
    # The run phase really was planned without network.
    plans = [r["attempts"][0]["plan"]["run_network_policy"]["mode"] for r in sandboxed.values()]
    assert set(plans) == {"none"}
    # Every session of the run was opened and closed, leaving nothing behind.
    journal = [
        json.loads(line)
        for path in (tmp_path / "runs" / "smoke-sandbox").glob("*/sessions.jsonl")
        for line in path.read_text().splitlines()
    ]
    names = {line["handle"]["name"] for line in journal}
    assert len(names) == 12
    for name in names:
        assert await census(name) == []


@pytest.mark.parametrize("environment", ["local", pytest.param("sandbox", marks=requires_sandbox)])
def test_a_task_needing_its_image_is_fatal_without_images_unless_host_userland(tmp_path: Path, environment: str) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(SMOKE / "checksum", tasks / "checksum")
    (tasks / "checksum" / "environment" / "Dockerfile").write_text("FROM debian:12\n")
    # The sandbox provider's feature images turned off: it has no way to make an image.
    provider = environment if environment == "local" else "sandbox, config: {images: false}"
    (record,) = _launch(tmp_path, f"docker-{environment}", provider, tasks).values()
    assert record["severity"] == "fatal"
    issue = record["attempts"][0]["issues"][0]
    assert (issue["severity"], issue["code"]) == ("fatal", "image_required")
    assert f"provider '{environment}' cannot build or pull" in issue["message"]
    # Opted out: it runs on the provider's userland, and says so.
    (record,) = _launch(tmp_path, f"host-{environment}", provider, tasks, benchmark=", host_userland: true").values()
    values, codes = _outcome(record)
    assert values["passed"] is True
    assert codes == ["image_not_built"]
    issue = record["attempts"][0]["issues"][0]
    assert issue["severity"] == "warning" and "its Dockerfile, which was not built" in issue["message"]


def _hostile_task(root: Path, name: str, solve: str, test: str) -> None:
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Do nothing useful.\n")
    (task / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 60.0\n')
    (task / "solution" / "solve.sh").write_text(solve)
    (task / "tests" / "test.sh").write_text(test)


# The agent leaves a daemon that keeps writing a perfect score wherever it can
# name the verifier's reward, and a verifier that writes one; the real verifier fails the task.
_REWRITER = """#!/usr/bin/env bash
cat > /tmp/rewrite.sh <<'SH'
while :; do
  mkdir -p /logs/verifier /tests 2>/dev/null
  echo 'mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt' > /tests/test.sh 2>/dev/null
  echo 1 > /logs/verifier/reward.txt 2>/dev/null
  for d in /proc/[0-9]*; do echo 1 > "$d/root/logs/verifier/reward.txt"; done 2>/dev/null
done
SH
setsid bash /tmp/rewrite.sh > /dev/null 2>&1 &
"""
_FAILS = """#!/usr/bin/env bash
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
sleep 0.5
"""


@requires_sandbox
async def test_a_daemon_left_by_the_agent_cannot_rewrite_the_reward(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    _hostile_task(tasks, "rewriter", _REWRITER, _FAILS)
    records = _launch(tmp_path, "rewriter", "sandbox", tasks, "{attempts: {k: 5}}")
    attempts = records["rewriter"]["attempts"]
    assert len(attempts) == 5
    assert [a["values"]["reward"] for a in attempts] == [0.0] * 5


@requires_sandbox
async def test_an_agent_that_kills_its_own_init_is_scored_not_fatal(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    _hostile_task(tasks, "suicide", "#!/usr/bin/env bash\nkill -9 -1\n", _FAILS.replace("echo 0", "echo 1"))
    records = _launch(tmp_path, "suicide", "sandbox", tasks, "{max_retries: 2}")
    record = records["suicide"]
    assert record["severity"] != "fatal", record
    (attempt,) = record["attempts"]
    assert attempt["retries"] == 0  # the agent's doing is never retried as infrastructure
    assert attempt["values"].get("reward") == 0.0
    assert all(issue["severity"] != "fatal" for issue in attempt["issues"]), attempt["issues"]
