"""SPEC 5 step 1 and SPEC 8: an attempt's plan is durable in its attempt
directory before its environment opens, so a run killed with SIGKILL says
what each of its open sessions was running."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import agentcompass
from agentcompass._store import task_key
from agentcompass._store._layout import RunLayout

REPO = Path(agentcompass.__file__).resolve().parents[1]
KEY = "sk-planplanplan0123456789abcdef"
HELD = 3
PLUGINS = Path(__file__).with_name("plan_plugins.py")


def _read_lines(fd: int, count: int, proc: subprocess.Popen[bytes], deadline: float) -> list[str]:
    data = b""
    while data.count(b"\n") < count:
        assert proc.poll() is None, "compass exited before its attempts started"
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"only {data.decode().count(chr(10))} of {count} attempts started in time"
        data += os.read(fd, 4096)
    return data.decode().splitlines()


def test_sigkill_while_attempts_run_leaves_the_plan_of_every_open_session_on_disk(tmp_path: Path) -> None:
    fifo = tmp_path / "started.fifo"
    os.mkfifo(fifo)
    config = {
        "plugins": [str(PLUGINS)],
        "orchestration": {"task_concurrency": HELD},
        "requests": [
            {
                "name": "held",
                "benchmark": {"id": "fake-bench", "config": {"tasks": ["a/1", "b 2", "c-3", "d", "e"]}},
                "environment": {"id": "fake-env"},
                "harness": {"id": "plan-hold-harness", "config": {"fifo": str(fifo)}},
                "model": {"name": "m", "base_url": "http://127.0.0.1:9/v1", "api_key": KEY},
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    output_root = tmp_path / "out"
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # never blocks a writer, never sees EOF
    command = [sys.executable, "-m", "agentcompass._cli", "launch", str(path), "--output-root", str(output_root)]
    with open(tmp_path / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        started = _read_lines(reader, HELD, proc, time.monotonic() + 60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(reader)

    (run_dir,) = (output_root / "held").iterdir()
    layout = RunLayout(run_dir)
    opened: dict[str, dict] = {}
    for line in Path(layout.sessions).read_text().splitlines():
        entry = json.loads(line)
        if entry["event"] == "opened":
            opened[entry["session"]] = entry
        else:
            opened.pop(entry["session"], None)
    assert len(opened) == HELD  # the attempts holding their run have their session open
    plans = {}
    for line in started:
        task_id, attempt = line.rsplit(" ", 1)
        text = Path(layout.plan(task_key(task_id), int(attempt))).read_text()
        assert KEY not in text
        data = json.loads(text)
        assert data["format"] == 1 and data["task_id"] == task_id and data["attempt"] == int(attempt)
        assert data["plan"]["task_id"] == task_id and data["plan"]["environment"]["id"] == "fake-env"
        plans[task_id] = data
    assert len(plans) == HELD
    # No attempt that had not started planning has a plan: the two tasks left waited for a slot.
    on_disk = sorted(p.parent.parent.name for p in Path(layout.tasks).glob("*/attempt-*/plan.json"))
    assert on_disk == sorted(task_key(t) for t in plans)
