"""Session names and sweeping (SPEC sections 4 and 8): the runtime names each
session before ``open``, with the run's tag, and ``--reuse`` / ``compass
reap`` of a dead run sweep each provider it used by that tag."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import attrs
import pytest
from _common import wait_dead

import agentcompass
import agentcompass.testing  # noqa: F401  (registers the fakes)
from agentcompass import NetworkPolicy, Orchestration
from agentcompass.environments.local import DIR_PREFIX, LocalEnvironment
from agentcompass.testing import call_log, fake_request
from agentcompass.testing._environment import FakeEnvironment

FULL = NetworkPolicy("full")


def _run_dir(root: Path, name: str) -> list[Path]:
    return sorted((root / name).iterdir())


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_every_session_is_named_with_the_runs_tag_before_open_and_journalled(tmp_path: Path) -> None:
    request = fake_request("named", benchmark={"tasks": 3}, output_root=tmp_path)
    result = await agentcompass.launch(Orchestration([request], task_concurrency=2))
    assert result.status == "succeeded"
    [run_dir] = _run_dir(tmp_path, "named")
    tag = json.loads((run_dir / "run_info.json").read_text())["tag"]
    assert re.fullmatch(r"[a-z0-9-]{1,20}", tag)

    log = call_log()
    # The name is already there when open is called (logged before it acts).
    open_names = [c.detail["name"] for c in log.select("open")]
    assert len(open_names) == 3 and len(set(open_names)) == 3
    for name in open_names:
        assert name.startswith(f"{tag}-") and re.fullmatch(r"[a-z0-9-]{1,40}", name), name

    opened = [line for line in _jsonl(run_dir / "sessions.jsonl") if line["event"] == "opened"]
    assert sorted(line["name"] for line in opened) == sorted(open_names)


async def test_reuse_of_a_dead_run_sweeps_its_provider_by_tag(tmp_path: Path) -> None:
    request = fake_request("swept", benchmark={"tasks": 2}, output_root=tmp_path)
    await agentcompass.launch(Orchestration([request], task_concurrency=1))
    [first] = _run_dir(tmp_path, "swept")
    tag = json.loads((first / "run_info.json").read_text())["tag"]
    # What a SIGKILL inside open leaves: a sandbox named with the run's tag
    # that no journal line names.
    env = FakeEnvironment({"log": "default"})
    await env.open({"task_id": "t000"}, FULL, f"{tag}-99")
    other = await env.open({"task_id": "t000"}, FULL, "acffffffffff-1")
    leaked = call_log().live_sessions()
    assert len(leaked) == 2

    result = await agentcompass.launch(Orchestration([attrs.evolve(request, reuse=True)], task_concurrency=1))
    assert result.status == "succeeded"
    sweeps = call_log().select("sweep")
    assert [c.detail["tag"] for c in sweeps] == [tag]
    # Only the run's own sandbox went; another run's stays.
    assert call_log().live_sessions() == {other.session_id}


async def test_local_names_its_directory_and_processes_and_sweep_destroys_them(tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    env = LocalEnvironment({"root": str(root)})
    mine = await env.open(None, FULL, "acaaaaaaaaaa-1")
    theirs = await env.open(None, FULL, "acbbbbbbbbbb-1")
    assert Path(mine.handle["path"]).name.startswith(f"{DIR_PREFIX}acaaaaaaaaaa-1-")
    # A daemon that left its process group and a half-made directory (killed
    # between mkdtemp and the marker).
    await mine.exec("setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo $! > $LOGS_DIR/pid")
    pid = int((Path(mine.handle["path"]) / "logs" / "pid").read_text())
    half = root / f"{DIR_PREFIX}acaaaaaaaaaa-2-xyz"
    half.mkdir()
    try:
        await env.sweep("acaaaaaaaaaa")
        await env.sweep("acaaaaaaaaaa")  # idempotent
        assert not Path(mine.handle["path"]).exists() and not half.exists()
        await wait_dead(pid)  # the swept sandbox's daemon
        assert (await theirs.exec("echo hi")).stdout == "hi\n"
    finally:
        await theirs.close()
        await mine.close()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def test_local_sweep_refuses_an_empty_tag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tag"):
        await LocalEnvironment({"root": str(tmp_path)}).sweep("")


def test_compass_reap_sweeps_the_runs_tag(tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    run_dir = tmp_path / "out" / "r" / "20260101T000000.000Z-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "run_info.json").write_text(
        json.dumps({"status": "running", "tag": "accccccccccc",
                    "request": {"environment": {"id": "local", "config": {"root": str(root)}}}})
    )
    left = root / f"{DIR_PREFIX}accccccccccc-1-abcdefgh"
    for sub in ("app", "tests", "logs", "solution"):
        (left / sub).mkdir(parents=True)
    (left / ".agentcompass-sandbox").write_text("{}")
    kept = root / f"{DIR_PREFIX}acdddddddddd-1-abcdefgh"
    kept.mkdir()
    proc = subprocess.run(
        ["compass", "reap", str(run_dir)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 0, proc.stderr
    assert not left.exists() and kept.exists()
