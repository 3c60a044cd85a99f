"""A full disk under one request (SPEC section 7): ``compass launch`` with
request ``a`` writing to a small real tmpfs that fills up while it runs, and
request ``b`` elsewhere. Exit 1, no traceback, ``b`` succeeded, ``a``
failed with one console line, and every sandbox opened was closed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from _ray_support import RayCluster

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
PLUGIN = Path(__file__).resolve().parent / "fault_plugins.py"


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs Linux and root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _request(name: str, output_root: Path, tmp_path: Path, **harness: object) -> dict:
    return {
        "name": name,
        "output_root": str(output_root),
        "benchmark": {"id": "fake-bench", "config": {"tasks": 6}},
        "environment": {
            "id": "rec-env",
            "config": {"log": str(tmp_path / "env.log"), "root": str(tmp_path / f"sandboxes-{name}")},
        },
        "harness": {"id": "rec-harness", "config": {"runs_log": str(tmp_path / "runs.log"), "seconds": 0.05, **harness}},
    }


def test_a_full_disk_fails_only_its_own_request(
    tmp_path: Path, small_tmpfs: Path, executor: RayCluster | None, request: pytest.FixtureRequest
) -> None:
    """On Ray the agent that fills the disk runs in a worker; the driver's
    writes fail all the same, and only for its request."""
    config: dict = {
        "plugins": [str(PLUGIN)],
        "orchestration": {"task_concurrency": 2, "cleanup_grace_seconds": 5},
        "requests": [
            _request("a", small_tmpfs, tmp_path, fill=str(small_tmpfs / "filler"), fill_task="t002"),
            _request("b", tmp_path / "out", tmp_path),
        ],
    }
    prefix: list[str] = []
    if executor is not None:
        # The driver runs in the cluster's own mount namespace, beside the
        # workers, and the tmpfs must be mounted there: one mounted on the
        # host after the cluster started does not show in it (the workers
        # would fill the real disk).
        [cluster, *_] = subprocess.run(
            ["ip", "netns", "pids", executor.netns], capture_output=True, text=True, check=True
        ).stdout.split()
        inside = ["nsenter", "-t", cluster, "-m"]
        if str(small_tmpfs) not in Path(f"/proc/{cluster}/mountinfo").read_text().split():
            subprocess.run([*inside, "mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small_tmpfs)], check=True)
            request.addfinalizer(lambda: subprocess.run([*inside, "umount", "-l", str(small_tmpfs)], check=False))
        config["orchestration"]["executor"] = executor.executor()
        prefix = [*inside, "-n"]
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("COMPASS_LOG_LEVEL", None)
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "agentcompass._cli", "launch", str(path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "a: failed" in proc.stdout and "b: succeeded" in proc.stdout, proc.stdout
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: a: request failed: ")]
    assert "No space left on device" in line, line
    [b_dir] = (tmp_path / "out" / "b").iterdir()
    assert json.loads((b_dir / "run_info.json").read_text())["status"] == "succeeded"

    # Every sandbox opened was closed, once, and none is left on disk.
    events = [ln.split() for ln in (tmp_path / "env.log").read_text().splitlines()]
    opened = Counter(e[1] for e in events if e[0] == "opened")
    closed = Counter(e[1] for e in events if e[0] == "close")
    # b's six and those of a's attempts whose plan was durable before the disk
    # filled (an attempt whose plan cannot be written opens no sandbox, SPEC 5).
    assert 6 < len(opened) <= 12 and opened == closed, (opened, closed)
    for name in ("a", "b"):
        assert list((tmp_path / f"sandboxes-{name}").iterdir()) == []
