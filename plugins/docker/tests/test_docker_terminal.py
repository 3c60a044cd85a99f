"""Terminal-Bench 2 shaped tasks as their authors wrote them (SPEC 10
"Terminal tasks" and "Images"), through ``compass launch``: they pass with
``oracle`` under ``docker``, are FATAL ``image_required`` under ``sandbox``
(``image_not_built`` with ``host_userland``), refused under ``local``
without writing the host's root; an agent sees neither the tests nor what
its image deleted; a killed docker launch leaves nothing after ``--reuse``."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from _common import read_json, wait_until

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
IMAGES = REPO / "benchmarks_data" / "terminal-images"
IMAGE_TASKS = sorted(d.name for d in IMAGES.iterdir() if d.is_dir())
FAULT_PLUGINS = REPO / "tests" / "faults" / "fault_plugins.py"
COMPASS = str(Path(sys.executable).with_name("compass"))

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="docker on Linux")


def _config(tmp_path: Path, name: str, environment: dict[str, Any], benchmark: dict[str, Any], **extra: Any) -> Path:
    config = {
        "orchestration": {"task_concurrency": 4, **extra.pop("orchestration", {})},
        "requests": [
            {
                "name": name,
                "benchmark": {"id": "terminal", "config": benchmark},
                "harness": {"id": "oracle"},
                "environment": environment,
                **extra,
            }
        ],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(config))
    return path


def _launch(config: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    done = subprocess.run(
        [COMPASS, "launch", str(config), "--output-root", str(tmp_path / "runs"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    runs = sorted((tmp_path / "runs").glob("*/*/run_info.json"), key=lambda p: p.stat().st_mtime)
    return done, runs[-1].parent


def _records(run: Path) -> dict[str, dict[str, Any]]:
    return {r["task_id"]: r for r in (read_json(p) for p in run.glob("details/*/*.json"))}


def _docker(daemon: Any) -> dict[str, Any]:
    return {"id": "docker", "config": {"host": daemon.host, "pull": "never"}}


def test_the_image_tasks_pass_with_oracle_under_docker(docker_daemon: Any, tmp_path: Path) -> None:
    config = _config(tmp_path, "images", _docker(docker_daemon), {"path": str(IMAGES)})
    done, run = _launch(config, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = _records(run)
    assert sorted(records) == IMAGE_TASKS
    for task, record in records.items():
        [attempt] = record["attempts"]
        assert attempt["values"]["passed"] is True, (task, attempt["issues"], attempt["run_result"]["artifacts"])
        assert attempt["issues"] == [], (task, attempt["issues"])
    # The offline task ran with no network but loopback, as its task.toml asks.
    assert records["offline"]["attempts"][0]["plan"]["run_network_policy"]["mode"] == "none"
    # The verifier's files are kept with the attempt.
    kept = list(run.glob("tasks/*/attempt-0/logs/verifier/reward.txt"))
    assert len(kept) == len(IMAGE_TASKS) - 1  # the older layout's verifier passes by its exit code
    metrics = read_json(run / "metrics.json")
    assert metrics["series"]["passed"]["value"] == 1.0


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None, reason="the sandbox provider needs root and bwrap"
)
def test_under_sandbox_they_need_their_image_unless_host_userland(tmp_path: Path) -> None:
    sandbox = {"id": "sandbox", "config": {"images": False}}  # with images, see plugins/sandbox/tests/test_sandbox_images.py
    done, run = _launch(_config(tmp_path, "sandboxed", sandbox, {"path": str(IMAGES)}), tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    records = _records(run)
    assert sorted(records) == IMAGE_TASKS
    codes = {task: [(i["severity"], i["code"]) for i in r["attempts"][0]["issues"]] for task, r in records.items()}
    assert set(map(tuple, codes.values())) == {(("fatal", "image_required"),)}, codes
    metrics = read_json(run / "metrics.json")
    assert metrics["evaluation_failed"] is True and metrics["series"]["reward"]["value"] is None
    assert "no official score" in (run / "summary.md").read_text().lower()

    done, run = _launch(_config(tmp_path, "host", sandbox, {"path": str(IMAGES), "host_userland": True}), tmp_path)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    for task, record in _records(run).items():
        issues = record["attempts"][0]["issues"]
        assert ("warning", "image_not_built") in [(i["severity"], i["code"]) for i in issues], (task, issues)
        assert not any(i["severity"] == "fatal" for i in issues), (task, issues)


def test_under_local_the_literal_path_tasks_are_refused_and_the_hosts_root_untouched(tmp_path: Path) -> None:
    written = [Path("/app/total.txt"), Path("/app/port.txt"), Path("/app/status.txt"), Path("/etc/audit-checked")]
    before = {path: path.exists() for path in written}
    config = _config(tmp_path, "local", {"id": "local"}, {"path": str(IMAGES), "host_userland": True})
    done, run = _launch(config, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    for task, record in _records(run).items():
        [issue] = record["attempts"][0]["issues"]
        assert (issue["severity"], issue["code"]) == ("fatal", "environment_unsupported"), (task, issue)
        assert "literal_paths" in issue["message"]
    assert {path: path.exists() for path in written} == before


_LIST_EVERYTHING = """#!/usr/bin/env bash
mkdir -p /logs/agent
find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /logs \\) -prune -o -print 2>/dev/null > /logs/agent/files.txt
pattern=SECRET; pattern="$pattern-ANSWER"  # not written whole here: this script is on the disk too
grep -rls --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=logs "$pattern" / > /logs/agent/secret.txt 2>/dev/null
sed -n 's/^build=//p' /etc/build-info > /app/build.txt
"""


def test_an_agent_listing_the_filesystem_finds_neither_the_tests_nor_the_deleted_file(
    docker_daemon: Any, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(IMAGES / "deleted-setup", tasks / "deleted-setup")
    (tasks / "deleted-setup" / "solution" / "solve.sh").write_text(_LIST_EVERYTHING)
    done, run = _launch(_config(tmp_path, "lister", _docker(docker_daemon), {"path": str(tasks)}), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = _records(run).values()
    assert record["attempts"][0]["values"]["passed"] is True
    [logs] = run.glob("tasks/*/attempt-0/logs/agent")
    files = (logs / "files.txt").read_text().splitlines()
    assert "/etc/build-info" in files and "/app/build.txt" not in files  # it listed the image, before solving
    assert not [f for f in files if f.startswith("/tests") or f.endswith("test.sh") or "setup.sh" in f]
    assert (logs / "secret.txt").read_text() == ""


_VERIFY = "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n"
TASKS, K, KILLS = 6, 2, 4


def _kill_tasks(root: Path) -> Path:
    for i in range(TASKS):
        task = root / f"k{i}"
        (task / "tests").mkdir(parents=True)
        (task / "environment").mkdir()
        (task / "instruction.md").write_text("Nothing to do.\n")
        (task / "tests" / "test.sh").write_text(_VERIFY)
        (task / "environment" / "Dockerfile").write_text(
            f"FROM agentcompass/base:bookworm\nRUN echo {i} > /opt/task && mkdir -p /app\nWORKDIR /app\n"
        )
    return root


def _expose_names() -> list[str]:
    from agentcompass_docker import _expose

    return os.listdir(_expose.STATE_ROOT) if _expose.STATE_ROOT.exists() else []


def _api(daemon: Any, path: str, **params: str) -> Any:
    transport = httpx.HTTPTransport(uds=daemon.host[len("unix://") :])
    with httpx.Client(transport=transport, base_url="http://docker") as client:
        return client.get(path, params=params).json()


def test_sigkill_of_a_docker_launch_at_random_instants_then_reuse_leaves_nothing(
    docker_daemon: Any, tmp_path: Path
) -> None:
    rng = random.Random(20261202)
    runs_log = tmp_path / "runs.log"
    # Every attempt exposes this directory in its session (as the installed harness does an agent's).
    exposed = tmp_path / "exposed"
    exposed.mkdir()
    (exposed / "keep.txt").write_text("kept\n")
    os.chmod(tmp_path, 0o755)
    config = {
        "plugins": [str(FAULT_PLUGINS)],
        "orchestration": {"task_concurrency": 3, "cleanup_grace_seconds": 10},
        "requests": [
            {
                "name": "killed",
                "benchmark": {"id": "terminal", "config": {"path": str(_kill_tasks(tmp_path / "tasks"))}},
                "harness": {
                    "id": "rec-harness",
                    "config": {"runs_log": str(runs_log), "seconds": 0.3, "expose": str(exposed)},
                },
                "environment": _docker(docker_daemon),
                "execution": {"attempts": {"k": K}},
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    output_root = tmp_path / "out"
    command = [COMPASS, "launch", str(path), "--output-root", str(output_root)]

    def run_dirs() -> set[Path]:
        return set((output_root / "killed").iterdir()) if (output_root / "killed").exists() else set()

    def runs() -> list[list[str]]:
        return [line.split() for line in runs_log.read_text().splitlines()] if runs_log.exists() else []

    pids: list[int] = []
    finished_by: dict[tuple[str, int], int] = {}
    for index in range(KILLS):
        before = run_dirs()
        with (tmp_path / f"stderr-{index}.txt").open("wb") as err:
            proc = subprocess.Popen(command + (["--reuse"] if index else []), stdout=subprocess.DEVNULL, stderr=err)
        pids.append(proc.pid)
        started = len(runs())
        try:
            # Kill while images build, sandboxes open or agents run: after a random
            # number of this process's attempts started (0: before any did).
            target = started + rng.randint(0, 3)
            wait_until(
                lambda target=target, proc=proc: len(runs()) >= target or proc.poll() is not None,
                "attempts to start",
                300,
                every=0.01,
            )
            time.sleep(rng.uniform(0, 0.6))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        for run_dir in run_dirs() - before:  # none when the kill came before the run directory
            for path_ in run_dir.glob("details/*/*.json"):
                record = read_json(path_)
                for attempt in record["attempts"]:
                    finished_by.setdefault((record["task_id"], attempt["attempt"]), index)
            for path_ in run_dir.glob("tasks/*/attempt-*/checkpoint.json"):
                data = read_json(path_)
                finished_by.setdefault((data["task_id"], data["record"]["attempt"]), index)

    before = run_dirs()
    final = subprocess.run(command + ["--reuse"], capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    [final_dir] = run_dirs() - before

    # Nothing left in the daemon: no container (sessions or builds) and no network of a session.
    assert _api(docker_daemon, "/containers/json", all="1") == []
    assert [n["Name"] for n in _api(docker_daemon, "/networks") if n["Name"] not in ("none", "host", "bridge")] == []
    # No mount of the exposed directory and no state directory of a session left on the host.
    with open("/proc/self/mountinfo") as mounts:
        assert [line for line in mounts if line.split()[3] == str(exposed)] == []
    tags = {read_json(p)["tag"] for p in output_root.glob("killed/*/run_info.json")}
    assert tags and [n for n in _expose_names() if n.startswith(tuple(tags))] == []
    assert sorted(p.name for p in exposed.iterdir()) == ["keep.txt"]

    # Nothing lost.
    assert read_json(final_dir / "run_info.json")["status"] == "succeeded"
    records = _records(final_dir)
    assert sorted(records) == [f"k{i}" for i in range(TASKS)]
    for record in records.values():
        assert [a["attempt"] for a in record["attempts"]] == list(range(K))
        assert all(a["values"]["passed"] is True for a in record["attempts"])

    # Nothing finished run twice (the last line of each attempt is the process that ran it last).
    process = {pid: i for i, pid in enumerate(pids)}
    ran = [(task, int(attempt), process.get(int(pid), KILLS)) for task, attempt, pid in runs()]
    assert set(Counter((t, a) for t, a, _ in ran)) == {(f"k{i}", a) for i in range(TASKS) for a in range(K)}
    repeated = [(t, a, p) for t, a, p in ran if (t, a) in finished_by and p > finished_by[(t, a)]]
    assert not repeated, repeated
