"""SIGKILL at random instants inside ``open``, each followed by ``--reuse``
(SPEC sections 4 and 8): zero sandboxes leaked, nothing lost, no finished
attempt run twice.

``rec-env`` (``fault_plugins.py``) makes its sandbox directory first and then
takes ``OPEN_SECONDS`` more before ``open`` returns, so a kill in that window
leaves a sandbox no journal line names: only ``sweep(tag)`` of the next
``--reuse`` finds it. The test waits (bounded polling of real files: these
are real processes) until the child has started the n-th open, n drawn from
a seeded RNG, then kills it after a random part of ``OPEN_SECONDS``.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _common import wait_until
from _ray_support import RayCluster

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
PLUGIN = Path(__file__).resolve().parent / "fault_plugins.py"
NAME = "kills"
TASKS = 10
K = 2
KILLS = 6
OPEN_SECONDS = 0.4
HANG_GUARD = 60.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux process semantics")


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _finished_attempts(run_dir: Path) -> set[tuple[str, int]]:
    found = set()
    for path in run_dir.glob("details/*/*.json"):
        record = json.loads(path.read_text())
        found |= {(record["task_id"], a["attempt"]) for a in record["attempts"] if a["status"] == "completed"}
    for path in run_dir.glob("tasks/*/attempt-*/checkpoint.json"):
        data = json.loads(path.read_text())
        if data["record"]["status"] == "completed":
            found.add((data["task_id"], data["record"]["attempt"]))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_inside_open_at_random_instants_then_reuse_leaks_nothing(
    tmp_path: Path, executor: RayCluster | None
) -> None:
    """On Ray (``executor``) the opens run in the workers: events are told
    apart by when they were logged (the processes run one after the other,
    and the test waits until a killed driver's workers are gone too)."""
    rng = random.Random(20261201)
    sandboxes, env_log, runs_log = tmp_path / "sandboxes", tmp_path / "env.log", tmp_path / "runs.log"
    output_root = tmp_path / "out"
    config = {
        "plugins": [str(PLUGIN)],
        "orchestration": {"task_concurrency": 3, "cleanup_grace_seconds": 5},
        "requests": [
            {
                "name": NAME,
                "benchmark": {"id": "fake-bench", "config": {"tasks": TASKS}},
                "environment": {
                    "id": "rec-env",
                    "config": {"log": str(env_log), "root": str(sandboxes), "open_seconds": OPEN_SECONDS},
                },
                "harness": {"id": "rec-harness", "config": {"runs_log": str(runs_log), "seconds": 0.02}},
                "execution": {"attempts": {"k": K}},
            }
        ],
    }
    if executor is not None:
        config["orchestration"]["executor"] = executor.executor()  # type: ignore[index]
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("COMPASS_LOG_LEVEL", None)
    prefix = executor.prefix if executor is not None else []
    command = [*prefix, sys.executable, "-m", "agentcompass._cli", "launch", str(path), "--output-root", str(output_root)]

    def start(index: int, reuse: bool) -> subprocess.Popen[bytes]:
        with (tmp_path / f"stderr-{index}.txt").open("wb") as err:
            return subprocess.Popen(
                command + (["--reuse"] if reuse else []), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err
            )

    def run_dirs() -> set[Path]:
        return set((output_root / NAME).iterdir()) if (output_root / NAME).exists() else set()

    starts: list[int] = []  # runs_log lines written before each process started
    finished_by: dict[tuple[str, int], int] = {}
    killed_inside_open = 0
    for index in range(KILLS):
        before = run_dirs()
        first = len(_lines(env_log))
        starts.append(len(_lines(runs_log)))
        proc = start(index, reuse=index > 0)
        target = rng.randint(1, 4)  # kill inside this process's target-th open

        def reached(
            proc: subprocess.Popen[bytes] = proc, target: int = target, index: int = index, first: int = first
        ) -> bool:
            assert proc.poll() is None, (tmp_path / f"stderr-{index}.txt").read_text()
            return sum(1 for e in _lines(env_log)[first:] if e[0] == "open") >= target

        try:
            wait_until(reached, f"process {index} to reach open {target}", HANG_GUARD, every=0.005)
            time.sleep(rng.uniform(0, OPEN_SECONDS * 0.8))
        finally:
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=HANG_GUARD) == -signal.SIGKILL
        workers = {int(e[2]) for e in _lines(env_log)[first:]} - {proc.pid}
        wait_until(lambda w=workers: not any(map(_alive, w)), "the killed driver's workers to stop", HANG_GUARD)
        events = _lines(env_log)[first:]
        done = {e[1] for e in events if e[0] == "opened"}
        began = {e[1] for e in events if e[0] == "open"}
        killed_inside_open += bool(began - done)
        [run_dir] = run_dirs() - before
        for attempt in _finished_attempts(run_dir):
            finished_by.setdefault(attempt, index)

    before = run_dirs()
    starts.append(len(_lines(runs_log)))
    final = start(KILLS, reuse=True)
    assert final.wait(timeout=HANG_GUARD * 2) == 0, (tmp_path / f"stderr-{KILLS}.txt").read_text()
    [final_dir] = run_dirs() - before

    # The kills landed inside open (a sandbox existed that no journal named).
    assert killed_inside_open >= KILLS - 1, killed_inside_open

    # Zero leaked: no sandbox left on disk, and every sandbox whose open began
    # was closed, reaped or swept.
    assert list(sandboxes.iterdir()) == []
    events = _lines(env_log)
    began = {e[1] for e in events if e[0] == "open"}
    gone = {e[1] for e in events if e[0] in ("close", "reap")}
    gone |= {name for e in events if e[0] == "sweep" for name in e[3:]}
    assert began - gone == set()
    assert any(e[0] == "sweep" and len(e) > 3 for e in events), "no kill left a sandbox for sweep to find"

    # Nothing lost.
    info = json.loads((final_dir / "run_info.json").read_text())
    assert info["status"] == "succeeded", info
    records = [json.loads(p.read_text()) for p in (final_dir / "details" / "normal").glob("*.json")]
    assert sorted(r["task_id"] for r in records) == [f"t{i:03d}" for i in range(TASKS)]
    for record in records:
        assert [a["attempt"] for a in record["attempts"]] == list(range(K))
        assert all(a["status"] == "completed" for a in record["attempts"])

    # No finished attempt run twice.
    runs = [
        (task, int(attempt), bisect.bisect_right(starts, line) - 1)
        for line, (task, attempt, _pid) in enumerate(_lines(runs_log))
    ]
    assert set(Counter((t, a) for t, a, _ in runs)) == {(f"t{i:03d}", a) for i in range(TASKS) for a in range(K)}
    repeated = [(t, a, p) for t, a, p in runs if (t, a) in finished_by and p > finished_by[(t, a)]]
    assert not repeated, repeated
