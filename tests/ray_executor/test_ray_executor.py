"""The ``ray`` executor against real ``compass`` processes and a real Ray cluster (SPEC 11).

The tasks run in Ray worker processes, so the components of
``ray_plugins.py`` report through one log file (see there) and the tests
read the run directory. Most tests share the session's loopback-only
cluster (``_ray_support``); the driver-kill test starts its own
``address: local`` cluster, in a network namespace of its own.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _common import only_run_dir, read_json, read_jsonl, wait_until
from _executor_runs import PLUGIN as FAULT_PLUGIN
from _executor_runs import journal, rec_request
from _ray_support import RayCluster, ray_skip_reason

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
PLUGIN = Path(__file__).resolve().parent / "ray_plugins.py"
HANG_GUARD = 180.0


def _config(tmp_path: Path, requests: list[tuple[str, int]], **settings: Any) -> dict[str, Any]:
    harness = settings.pop("harness", {})
    execution = settings.pop("execution", {})
    return {
        "plugins": [str(PLUGIN)],
        "orchestration": {"task_concurrency": 4, "cleanup_grace_seconds": 10, **settings},
        "requests": [
            {
                "name": name,
                "benchmark": {"id": "fake-bench", "config": {"tasks": [f"{name}{i}" for i in range(tasks)]}},
                "environment": {
                    "id": "ray-log-local",
                    "config": {"root": str(tmp_path / "sandboxes"), "log": str(tmp_path / "log.txt")},
                },
                "harness": {"id": "ray-log-harness", "config": {"log": str(tmp_path / "log.txt"), **harness}},
                "execution": execution,
            }
            for name, tasks in requests
        ],
    }


def _start(
    tmp_path: Path,
    config: dict[str, Any],
    prefix: list[str],
    *args: str,
    name: str = "run",
    debug: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("COMPASS_LOG_LEVEL", None)
    command = [*prefix, sys.executable, "-m", "agentcompass._cli", *(["--log-level", "debug"] if debug else [])]
    command += ["launch", str(path)]
    command += ["--output-root", str(tmp_path / "out"), *args]
    with (tmp_path / f"{name}.out").open("wb") as out, (tmp_path / f"{name}.err").open("wb") as err:
        return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=err)


def _log(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "log.txt"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _runs(tmp_path: Path) -> list[tuple[str, int, int]]:
    return [(f[1], int(f[2]), int(f[3])) for f in _log(tmp_path) if f[0] == "run"]


def _records(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {r["task_id"]: r for r in (read_json(p) for p in run_dir.glob("details/*/*.json"))}


def _all_closed(run_dir: Path) -> None:
    lines = read_jsonl(run_dir / "sessions.jsonl")
    opened = {line["session"] for line in lines if line["event"] == "opened"}
    closed = {line["session"] for line in lines if line["event"] == "closed"}
    assert opened and opened == closed


def _err(tmp_path: Path, name: str = "run") -> str:
    return (tmp_path / f"{name}.err").read_text()


def _driver_knows(tmp_path: Path, tasks: set[str], stage: str) -> bool:
    """Whether the driver learnt (its debug log) that the attempts of ``tasks``
    entered ``stage``: only then can a lost worker's attempts name it."""
    lines = [line for line in _err(tmp_path).splitlines() if "attempt_stage" in line and f"stage={stage}" in line]
    return all(any(re.search(rf"\btask_id={re.escape(task)}[,)]", line) for line in lines) for task in tasks)


def test_limits_and_order_hold_across_all_workers_together(tmp_path: Path, ray_cluster: RayCluster) -> None:
    capacity, qps = 2, 4.0
    config = _config(
        tmp_path,
        [("a", 6), ("b", 4)],
        executor=ray_cluster.executor(),
        providers={"ray-log-local": {"capacity": capacity, "open_qps": qps}},
        harness={"seconds": 0.3},
    )
    proc = _start(tmp_path, config, ray_cluster.prefix)
    assert proc.wait(timeout=HANG_GUARD) == 0, _err(tmp_path)

    runs = _runs(tmp_path)
    assert len(runs) == 10
    assert len({pid for _, _, pid in runs}) == 2, "both workers ran tasks"
    # Ordered dispatch: every task of the first request runs before any of the second.
    assert {task for task, _, _ in runs[:6]} == {f"a{i}" for i in range(6)}
    # Provider capacity across both workers: never more than 2 sessions at once.
    events = sorted((float(f[1]), 1 if f[0] == "open" else -1) for f in _log(tmp_path) if f[0] in ("open", "close"))
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    assert peak == capacity
    # Open rate across both workers: 10 opens at 4/s take at least 9/4 s.
    opens = [t for t, step in events if step == 1]
    # Session names are unique across the workers (each has its own counter).
    names = [f[3] for f in _log(tmp_path) if f[0] == "open"]
    assert len(set(names)) == len(names) == 10
    assert opens[-1] - opens[0] >= (len(opens) - 1) / qps - 0.1
    for name in ("a", "b"):
        run_dir = only_run_dir(tmp_path / "out", name)
        assert read_json(run_dir / "run_info.json")["status"] == "succeeded"
        _all_closed(run_dir)
    assert list((tmp_path / "sandboxes").iterdir()) == []


def test_a_killed_worker_fails_its_attempts_worker_lost_and_they_finish_on_the_other(
    tmp_path: Path,
    ray_cluster: RayCluster,
) -> None:
    seconds = 4
    config = _config(
        tmp_path,
        [("w", 4)],
        task_concurrency=3,
        executor=ray_cluster.executor(),
        harness={"seconds": seconds},
        execution={"max_retries": 2, "retry_min_delay_seconds": 0.1, "retry_max_delay_seconds": 0.2},
    )
    proc = _start(tmp_path, config, ray_cluster.prefix, debug=True)
    try:
        wait_until(lambda: len({pid for _, _, pid in _runs(tmp_path)}) == 2, "runs on both workers", HANG_GUARD)
        victim = _runs(tmp_path)[0][2]
        running = {task for task, _, pid in _runs(tmp_path) if pid == victim}
        wait_until(lambda: _driver_knows(tmp_path, running, "run"), "the driver to learn the runs started", HANG_GUARD)
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(timeout=HANG_GUARD) == 0, _err(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    runs = _runs(tmp_path)
    # task_concurrency across both workers: the fourth task started only once
    # one of the first three was done (a lost one keeps its slot while retried).
    starts = {f[1]: float(f[4]) for f in reversed(_log(tmp_path)) if f[0] == "run"}
    first = sorted(starts.values())
    assert first[3] - first[0] >= seconds * 0.9, starts
    lost = {task for task, _, pid in runs if pid == victim}
    assert lost, "the killed worker was running tasks"
    run_dir = only_run_dir(tmp_path / "out", "w")
    assert read_json(run_dir / "run_info.json")["status"] == "succeeded"
    records = _records(run_dir)
    assert set(records) == {f"w{i}" for i in range(4)}
    for task, record in records.items():
        [attempt] = record["attempts"]
        assert attempt["status"] == "completed", record
        # Each ran once per try: the killed worker's tasks once more, elsewhere.
        pids = [pid for t, _, pid in runs if t == task]
        if task in lost:
            assert attempt["retries"] == 1
            assert len(pids) == 2 and pids[-1] != victim
            [discarded] = (run_dir / "tasks").glob(f"{task}/attempt-0/retries/*.json")
            issue = read_json(discarded)["issues"][0]
            assert (issue["severity"], issue["code"], issue["phase"]) == ("fatal", "worker_lost", "run")
        else:
            assert attempt["retries"] == 0 and len(pids) == 1
    _all_closed(run_dir)
    # The killed worker's sandboxes were reaped, the others closed.
    assert list((tmp_path / "sandboxes").iterdir()) == []
    assert "worker_lost" in _err(tmp_path)


@pytest.mark.parametrize(("stage", "script"), [("setup", "prepare"), ("evaluate", "evaluate")])
def test_worker_lost_is_in_the_stage_the_attempt_was_in(
    tmp_path: Path, ray_cluster: RayCluster, stage: str, script: str
) -> None:
    """The worker streams the stage each attempt enters: a worker killed while
    its attempts prepare (or evaluate, in a fresh session) fails them FATAL
    ``worker_lost`` in that stage, and the retry on the other worker runs
    the whole attempt again."""
    tasks = [f"s{i}" for i in range(4)]
    request = rec_request(
        tmp_path,
        "lost",
        tasks,
        benchmark={"plan": {"evaluation_environment_mode": "fresh"}, "script": {"*": {script: ["sleep:3"]}}},
        execution={"max_retries": 1, "retry_min_delay_seconds": 0.01, "retry_max_delay_seconds": 0.02},
    )
    config = {
        "plugins": [str(FAULT_PLUGIN)],
        "orchestration": {"task_concurrency": 4, "cleanup_grace_seconds": 10, "executor": ray_cluster.executor()},
        "requests": [request],
    }
    proc = _start(tmp_path, config, ray_cluster.prefix, debug=True)

    def calls() -> list[list[str]]:
        return [f for f in journal(tmp_path) if f[0] == script]

    try:
        wait_until(lambda: len({f[2] for f in calls()}) == 2, f"{script} on both workers", HANG_GUARD)
        victim = int(calls()[0][2])
        inside = {f[3] for f in calls() if int(f[2]) == victim}
        wait_until(lambda: _driver_knows(tmp_path, inside, stage), f"the driver to learn of the {stage}", HANG_GUARD)
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(timeout=HANG_GUARD) == 0, _err(tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    lost = {f[3] for f in calls() if int(f[2]) == victim}
    assert lost
    run_dir = only_run_dir(tmp_path / "out", "lost")
    records = _records(run_dir)
    for task in tasks:
        [attempt] = records[task]["attempts"]
        assert attempt["status"] == "completed", records[task]
        discarded = [read_json(p) for p in run_dir.glob(f"tasks/{task}/attempt-0/retries/*.json")]
        if task in lost:
            [data] = discarded
            [issue] = data["issues"]
            assert (issue["code"], issue["phase"], data["stage"], data["scope"]) == ("worker_lost", stage, stage, "attempt")
            assert attempt["retries"] == 1
            # The whole attempt again, on the other worker.
            prepares = [int(f[2]) for f in journal(tmp_path) if f[0] == "prepare" and f[3] == task]
            assert len(prepares) == 2 and prepares[-1] != victim
        else:
            assert not discarded and attempt["retries"] == 0
    _all_closed(run_dir)
    assert list((tmp_path / "sandboxes").iterdir()) == []


def _listening(pid: int) -> list[tuple[str, str]]:
    """``(process name, local address)`` of every listening TCP and bound UDP
    socket in the network namespace of ``pid``."""
    out = subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "ss", "-H", "-l", "-t", "-u", "-n", "-p"],
        capture_output=True, text=True, check=True,
    ).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        name = re.search(r'users:\(\("([^"]+)"', line)
        found.append((name.group(1) if name else "?", fields[4]))
    return found


def _loopback(address: str) -> bool:
    """Whether ``host:port`` (``[v6]:port``, ``*:port``) is a loopback address."""
    host = address.rsplit(":", 1)[0].strip("[]").split("%")[0]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # "*": every address
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _in_netns(inode: str) -> list[int]:
    """Pids of the processes in the network namespace ``inode`` names."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == inode:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_a_killed_driver_takes_its_local_cluster_along_and_reuse_finishes_the_run(tmp_path: Path) -> None:
    reason = ray_skip_reason()
    if reason is not None or shutil.which("unshare") is None:
        pytest.skip(reason or "needs unshare(1)")
    k = 2
    config = _config(
        tmp_path,
        [("d", 6)],
        executor={"id": "ray", "config": {"address": "local", "workers": 2}},
        harness={"seconds": 1},
        execution={"attempts": {"k": k}},
    )
    # A network namespace of its own, with a routable address besides
    # loopback (a veth pair with a default route), as a host has: Ray would
    # listen there too if the local cluster let it.
    setup = (
        "ip link set lo up && ip link add v0 type veth peer name v1 && ip addr add 10.77.0.1/24 dev v0"
        " && ip link set v0 up && ip link set v1 up && ip route add default via 10.77.0.2"
    )
    netns = ["unshare", "-n", "sh", "-c", setup + ' && exec "$@"', "sh"]
    proc = _start(tmp_path, config, netns)
    try:
        wait_until(lambda: len(_runs(tmp_path)) >= 5, "a few runs", HANG_GUARD)
        inode = os.readlink(f"/proc/{proc.pid}/ns/net")
        assert len(_in_netns(inode)) > 3, "the cluster's processes run beside the driver"
        # Every server of the running cluster (GCS, raylet, runtime-env
        # agent, the workers' and the driver's own) listens on loopback only.
        listening = _listening(proc.pid)
        assert {"gcs_server", "raylet"} <= {name for name, _ in listening}, listening
        assert all(_loopback(address) for _, address in listening), listening
        # No Ray Client server (ray start's default port 10001): the driver connects directly.
        assert not [a for _, a in listening if a.endswith(":10001")], listening
        proc.kill()
        assert proc.wait(timeout=HANG_GUARD) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # gcs, raylet, workers: gone with the driver.
    wait_until(lambda: not _in_netns(inode), "the local cluster to stop", 60, every=0.2)
    killed_dir = only_run_dir(tmp_path / "out", "d")
    finished = {
        (r["task_id"], a["attempt"]) for r in _records(killed_dir).values() for a in r["attempts"]
    } | {
        (read_json(p)["task_id"], read_json(p)["record"]["attempt"])
        for p in killed_dir.glob("tasks/*/attempt-*/checkpoint.json")
    }
    ran_before = len(_runs(tmp_path))

    config["orchestration"].pop("executor")
    resumed = _start(tmp_path, config, [], "--reuse", name="reuse")
    assert resumed.wait(timeout=HANG_GUARD) == 0, _err(tmp_path, "reuse")

    [final_dir] = [d for d in (tmp_path / "out" / "d").iterdir() if d != killed_dir]
    records = _records(final_dir)
    assert len(records) == 6
    assert all(a["status"] == "completed" for r in records.values() for a in r["attempts"])
    assert all(len(r["attempts"]) == k for r in records.values())
    again = [(task, attempt) for task, attempt, _ in _runs(tmp_path)[ran_before:] if (task, attempt) in finished]
    assert not again, f"finished attempts ran again: {again}"
    assert list((tmp_path / "sandboxes").iterdir()) == []


def test_auto_joins_the_cluster_ray_address_names(tmp_path: Path, ray_cluster: RayCluster) -> None:
    """``address: auto`` is Ray's own: ``RAY_ADDRESS`` (else the cluster last
    started on this machine). The session's cluster is an existing one; the
    run's workers are actors on it (the other tests join it by its GCS
    address, ``host:port``)."""
    config = _config(tmp_path, [("auto", 4)], executor={"id": "ray", "config": {"address": "auto", "workers": 2}})
    env = {"RAY_ADDRESS": ray_cluster.address}
    proc = _start(tmp_path, config, ray_cluster.prefix, env=env)
    assert proc.wait(timeout=HANG_GUARD) == 0, _err(tmp_path)
    run_dir = only_run_dir(tmp_path / "out", "auto")
    assert read_json(run_dir / "run_info.json")["status"] == "succeeded"
    pids = {pid for _, _, pid in _runs(tmp_path)}
    assert len(pids) == 2 and proc.pid not in pids


@pytest.mark.skipif(importlib.util.find_spec("grpc") is None, reason="Ray Client is not installed (pip install 'ray[client]')")
def test_ray_client_address_runs_the_tasks_on_the_cluster(tmp_path: Path, ray_cluster: RayCluster) -> None:
    """``ray://host:port`` connects through the cluster's Ray Client server,
    as from outside the cluster: the same run, on the cluster's workers."""
    executor = {"id": "ray", "config": {"address": ray_cluster.client_address, "workers": 2}}
    config = _config(tmp_path, [("client", 4)], executor=executor)
    proc = _start(tmp_path, config, ray_cluster.prefix)
    assert proc.wait(timeout=HANG_GUARD) == 0, _err(tmp_path) + ray_cluster.logs("ray_client_server*")
    run_dir = only_run_dir(tmp_path / "out", "client")
    assert read_json(run_dir / "run_info.json")["status"] == "succeeded"
    _all_closed(run_dir)
    pids = {pid for _, _, pid in _runs(tmp_path)}
    assert len(pids) == 2 and proc.pid not in pids


def test_an_unknown_executor_is_a_config_error(tmp_path: Path) -> None:
    config = _config(tmp_path, [("x", 1)], executor={"id": "slurm"})
    proc = _start(tmp_path, config, [])
    assert proc.wait(timeout=HANG_GUARD) == 2
    err = _err(tmp_path).strip()
    assert len(err.splitlines()) == 1 and "orchestration.executor: unknown executor 'slurm'" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed here")
def test_ray_without_ray_installed_is_a_config_error_saying_how_to_install_it(tmp_path: Path) -> None:
    config = _config(tmp_path, [("x", 1)], executor={"id": "ray"})
    proc = _start(tmp_path, config, [])
    assert proc.wait(timeout=HANG_GUARD) == 2
    err = _err(tmp_path).strip()
    assert len(err.splitlines()) == 1 and "pip install 'agentcompass[ray]'" in err, err
