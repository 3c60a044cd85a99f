"""SIGINT, SIGTERM, SIGHUP and the deadline against the real engine, through the real CLI.

Each test runs ``python -m agentcompass._cli launch`` as a subprocess on
``fake-bench`` with the test-only Environment and harness of
``cli_plugins/slow_plugins.py``, whose tasks hang in ``run_task``. Fake
state is per process, so the test learns what the child is doing from a
FIFO the components write to (``running <task>``, ``closing <n>``) and what
it did from the run directory (``sessions.jsonl``, ``run_info.json``,
``progress.jsonl``).

Nothing here sleeps or polls: the test blocks in ``select`` on the FIFO and
on a pidfd of the child, so it wakes on the event itself (or on the child
dying early). Real time is used only for process-level bounds.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from _ray_support import RayCluster

import agentcompass

REPO = Path(agentcompass.__file__).resolve().parents[1]
PLUGIN = Path(__file__).resolve().parent / "cli_plugins" / "slow_plugins.py"
TASKS = 3
HANG_GUARD = 60.0  # seconds; only reached when something is broken
MARGIN = 10.0  # seconds on top of a bound the child must meet, for process start-up noise

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")


class Child:
    """One ``compass launch`` subprocess plus the FIFO its components report to.

    The FIFO is opened read-write by the test before the child starts, so
    the child's non-blocking opens for writing always find a reader and the
    test never sees EOF between writers.
    """

    def __init__(
        self,
        tmp_path: Path,
        *,
        close: str = "ok",
        grace: float = 5,
        args: tuple[str, ...] = (),
        entry: tuple[str, ...] = ("-m", "agentcompass._cli"),
        cluster: RayCluster | None = None,
    ):
        """``entry``: what ``python`` runs, given ``launch CONFIG ...`` (default: ``compass``);
        ``cluster``: run the tasks there (the ``ray`` executor) instead of in process."""
        self.tmp_path = tmp_path
        fifo = tmp_path / "events.fifo"
        os.mkfifo(fifo)
        config = {
            "plugins": [str(PLUGIN)],
            "orchestration": {"task_concurrency": TASKS, "cleanup_grace_seconds": grace},
            "requests": [
                {
                    "name": "signals",
                    "benchmark": {"id": "fake-bench", "config": {"tasks": TASKS}},
                    "environment": {"id": "signal-test-env", "config": {"fifo": str(fifo), "close": close}},
                    "harness": {"id": "signal-test-harness", "config": {"fifo": str(fifo)}},
                }
            ],
        }
        if cluster is not None:
            config["orchestration"]["executor"] = cluster.executor()  # type: ignore[index]
        path = tmp_path / "config.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        self.output_root = tmp_path / "out"
        self.stdout_path = tmp_path / "stdout.txt"
        self.stderr_path = tmp_path / "stderr.txt"
        self.events: list[str] = []
        self._buffer = b""
        self._fifo = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.pop("COMPASS_LOG_LEVEL", None)
        command = [
            *(cluster.prefix if cluster is not None else []),
            sys.executable,
            *entry,
            "launch",
            str(path),
            "--output-root",
            str(self.output_root),
        ]
        with self.stdout_path.open("w") as stdout, self.stderr_path.open("w") as stderr:
            self.proc = subprocess.Popen([*command, *args], cwd=tmp_path, env=env, stdout=stdout, stderr=stderr)
        try:
            self._pidfd: int | None = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # no pidfd: an early exit is then caught by the hang guard
            self._pidfd = None

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self._fifo)
        if self._pidfd is not None:
            os.close(self._pidfd)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def _read_fifo(self) -> None:
        try:
            chunk = os.read(self._fifo, 65536)
        except BlockingIOError:
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        self.events.extend(line.decode() for line in lines)

    def count(self, kind: str) -> int:
        return sum(1 for event in self.events if event.split()[0] == kind)

    def expect(self, kind: str, count: int) -> None:
        """Block until the components reported ``count`` events ``kind`` in all."""
        deadline = time.monotonic() + HANG_GUARD
        watched = [self._fifo] + ([self._pidfd] if self._pidfd is not None else [])
        while self.count(kind) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {count} {kind!r} events within {HANG_GUARD}s: {self.events}\n{self.stderr}")
            ready, _, _ = select.select(watched, [], [], remaining)
            if self._fifo in ready:
                self._read_fifo()
            elif ready:  # the pidfd: the child exited
                self._read_fifo()
                if self.count(kind) < count:
                    raise AssertionError(
                        f"child exited ({self.proc.wait()}) before {count} {kind!r} events: {self.events}\n{self.stderr}"
                    )

    def interrupt(self, signum: int = signal.SIGINT) -> float:
        """Send ``signum``; return when it was sent (``time.monotonic``)."""
        self.proc.send_signal(signum)
        return time.monotonic()

    def wait(self, timeout: float) -> tuple[int, float]:
        """The exit code and when the exit was seen (``time.monotonic``)."""
        code = self.proc.wait(timeout=timeout)
        return code, time.monotonic()

    def run_dir(self) -> Path:
        [run_dir] = [p for p in (self.output_root / "signals").iterdir() if p.is_dir()]
        return run_dir


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _sessions(run_dir: Path) -> tuple[list[str], list[str]]:
    """Session ids journalled as opened and as closed."""
    lines = _jsonl(run_dir / "sessions.jsonl")
    opened = [line["session"] for line in lines if line["event"] == "opened"]
    closed = [line["session"] for line in lines if line["event"] == "closed"]
    assert {line["provider"] for line in lines} == {"signal-test-env"}
    return opened, closed


def _status(run_dir: Path) -> str:
    return json.loads((run_dir / "run_info.json").read_text())["status"]


def _assert_finished(run_dir: Path, status: str) -> None:
    """Every session closed exactly once, and the run persisted ``status``."""
    opened, closed = _sessions(run_dir)
    assert len(opened) == TASKS
    assert sorted(closed) == sorted(opened)
    assert _status(run_dir) == status
    events = _jsonl(run_dir / "progress.jsonl")
    assert events[0]["event"] == "run_started"
    assert events[-1]["event"] == "run_finished"
    assert events[-1]["status"] == status


SIGNALS = [
    pytest.param(signal.SIGINT, 130, "interrupted: cleaning up (Ctrl-C again to exit now)", id="SIGINT"),
    pytest.param(signal.SIGTERM, 143, "interrupted by SIGTERM: cleaning up", id="SIGTERM"),
    pytest.param(signal.SIGHUP, 129, "interrupted by SIGHUP: cleaning up", id="SIGHUP"),
]


@pytest.mark.parametrize(("signum", "exit_code", "message"), SIGNALS)
def test_first_signal_closes_every_session_and_exits_with_its_code(
    tmp_path: Path, signum: int, exit_code: int, message: str, executor: RayCluster | None
) -> None:
    grace = 5.0
    with Child(tmp_path, grace=grace, cluster=executor) as child:
        child.expect("running", TASKS)
        sent = child.interrupt(signum)
        code, exited = child.wait(timeout=grace + MARGIN)
    assert code == exit_code, child.stderr
    assert exited - sent < grace + MARGIN
    assert message in child.stderr
    assert "Traceback" not in child.stderr
    _assert_finished(child.run_dir(), "cancelled")


@pytest.mark.parametrize(("signum", "exit_code", "message"), SIGNALS)
def test_second_signal_exits_at_once_while_cleanup_hangs(
    tmp_path: Path, signum: int, exit_code: int, message: str, executor: RayCluster | None
) -> None:
    with Child(tmp_path, close="hang", grace=60, cluster=executor) as child:
        child.expect("running", TASKS)
        child.interrupt(signum)
        # Every session's close has started and hangs: the first signal is being
        # handled and cleanup would wait out the whole 60 s grace.
        child.expect("closing", TASKS)
        sent = child.interrupt(signum)
        code, exited = child.wait(timeout=MARGIN)  # well inside the 60 s grace
    assert code == exit_code, child.stderr
    # At once means not waiting for the hanging cleanup: the bound is far below
    # its 60 s grace and generous for a loaded machine's process teardown.
    assert exited - sent < MARGIN
    assert child.stderr.count("cleaning up") == 1
    run_dir = child.run_dir()
    # Exited without finishing cleanup: the sessions stay journalled as open
    # (for `compass reap` or the next --reuse) and the run never finalized.
    # The exit writes journal lines still queued, so a line a commit round
    # was writing at that instant may appear twice (readers match by id).
    opened, closed = _sessions(run_dir)
    assert len(set(opened)) == TASKS
    assert closed == []
    if executor is None:
        assert _status(run_dir) == "running"
    else:
        # On Ray the cancellation reaches the workers' sessions a message
        # later: the driver may have written the terminal status by then.
        assert _status(run_dir) in ("running", "cancelled")


def test_timeout_closes_every_session_and_exits_1(tmp_path: Path, executor: RayCluster | None) -> None:
    grace = 5.0
    # The deadline must pass after every task started: on Ray, workers take longer to start them.
    timeout = 2.0 if executor is None else 15.0
    with Child(tmp_path, grace=grace, args=("--timeout-seconds", str(timeout)), cluster=executor) as child:
        child.expect("running", TASKS)
        code, _ = child.wait(timeout=timeout + grace + MARGIN)
    assert code == 1, child.stderr
    assert "Traceback" not in child.stderr
    assert "interrupted" not in child.stderr
    assert "timed_out (exit 1)" in child.stdout_path.read_text()
    _assert_finished(child.run_dir(), "timed_out")
