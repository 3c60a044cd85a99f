"""A Ray cluster for the tests that run the ``ray`` executor.

Ray 2.60's GCS and raylet listen on every address, so the test cluster
lives in a network namespace of its own with only loopback: one cluster
per pytest session (``ray start --head --block`` in the namespace, stopped
at the end), small (``--num-cpus 4``). A test runs ``compass`` in that
namespace (:attr:`RayCluster.prefix`) with ``orchestration.executor`` set
to :meth:`RayCluster.executor`. Without Ray, root or ``ip`` the tests skip
with one line.

Which tests run on it: the ones that drive real ``compass`` processes in
real time (signals, deadline and grace, kills, reuse). The orchestration
tests on ``MockClock``/``autojump_clock`` cannot: a mock clock lives in the
test's own Trio run, and a Ray worker runs its own ``trio.run`` in another
process on the real clock; their fakes also record calls in the test
process's memory, which a worker cannot reach.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentcompass._ray._cluster import _die_with_parent

__all__ = ["RayCluster", "executor", "ray_cluster", "ray_skip_reason"]

RAY_START = "from ray.scripts.scripts import main; main()"
START_SECONDS = 120
#: The cluster's Ray Client server (``address: ray://``), below Ray's worker ports.
CLIENT_PORT = 10001


def ray_skip_reason() -> str | None:
    """Why the Ray tests cannot run here (None: they can)."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install 'agentcompass[ray]')"
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "the Ray test cluster needs root and ip(8) for its loopback-only network namespace"
    return None


@attrs.frozen
class RayCluster:
    """The session's cluster: its namespace and address."""

    netns: str
    address: str
    temp_dir: str

    def logs(self, pattern: str) -> str:
        """The tails of the cluster's log files matching ``pattern`` (for a failure's message)."""
        found = sorted(Path(self.temp_dir).glob(f"session_*/logs/{pattern}"))
        return "\n".join(f"== {p.name}\n" + p.read_text(errors="replace")[-3000:] for p in found)

    @property
    def prefix(self) -> list[str]:
        """Run a command in the cluster's network namespace."""
        return ["ip", "netns", "exec", self.netns]

    @property
    def client_address(self) -> str:
        """The cluster through Ray Client."""
        return f"ray://127.0.0.1:{CLIENT_PORT}"

    def executor(self, **config: Any) -> dict[str, Any]:
        """``orchestration.executor`` for this cluster (2 workers unless told)."""
        return {"id": "ray", "config": {"address": self.address, "workers": 2, **config}}


def _start(netns: str, temp_dir: str) -> subprocess.Popen[bytes]:
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    return subprocess.Popen(
        [  # ``ip netns exec`` execs ray: the death signal (pytest killed) reaches it
            "ip", "netns", "exec", netns, sys.executable, "-c", RAY_START, "start", "--head", "--block",
            "--node-ip-address=127.0.0.1", "--port=6379", "--num-cpus=4", "--include-dashboard=false",
            "--disable-usage-stats", f"--temp-dir={temp_dir}", f"--ray-client-server-port={CLIENT_PORT}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    reason = ray_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    netns = f"compass-ray-{os.getpid()}-{secrets.token_hex(2)}"
    temp_dir = tempfile.mkdtemp(prefix="compass-ray-test-")
    process = _start(netns, temp_dir)
    try:
        assert process.stdout is not None
        seen = []
        for raw in process.stdout:
            seen.append(raw.decode(errors="replace"))
            if "Ray runtime started" in seen[-1]:
                break
        else:
            raise AssertionError("the Ray test cluster did not start:\n" + "".join(seen[-20:]))
        # Keep reading what it prints (its pipe must not fill up).
        threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()  # type: ignore[union-attr]
        yield RayCluster(netns, "127.0.0.1:6379", temp_dir)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        subprocess.run(["ip", "netns", "del", netns], check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(params=["inprocess", "ray"])
def executor(request: pytest.FixtureRequest) -> RayCluster | None:
    """Parametrizes a test over the executors: None in process, else the
    session's :class:`RayCluster` (the Ray case skips without Ray)."""
    if request.param == "inprocess":
        return None
    cluster: RayCluster = request.getfixturevalue("ray_cluster")
    return cluster
