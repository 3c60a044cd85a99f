"""``address: local``: a Ray cluster on this machine for one run.

``ray start --head --block`` runs as a child of the driver, with the node's
address on loopback, no dashboard, no usage stats and a temporary
directory of its own (so no state of another cluster, such as an
authentication token file, leaks in). ``--block`` makes that process the
cluster's supervisor: on SIGTERM it stops the GCS, the raylet and every
worker. The driver sends it SIGTERM on the way out; if the driver itself
dies (even by SIGKILL) the kernel sends it SIGTERM (``PR_SET_PDEATHSIG``),
so a killed driver's cluster does not outlive it.

Every server of the cluster listens on loopback only, and no Ray Client
server is started (``ray start``'s default, on port 10001: the driver
connects directly, see :data:`_START`). ``ray start``
alone would not do it: it replaces a loopback ``--node-ip-address`` with
the address other nodes can reach, and its GCS, raylet and workers then
listen on every address. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's
single-machine mode: no other node may join) keeps the node's address
127.0.0.1, so every server binds it; the driver connects with the same
setting (``open_ray_executor``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator

import trio

from ..runtime._errors import ConfigError

__all__ = ["SINGLE_MACHINE", "local_cluster"]

#: Ray's switch that keeps a node's address on loopback (see the module docstring).
SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

#: How long ``ray start`` may take to report the cluster up.
START_SECONDS = 90

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the driver's thread exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _temp_dir(root: str | None = None) -> str:
    """A new directory for the cluster's sessions and logs, under one parent
    per machine. A killed driver cannot remove its own: the next local
    cluster removes those whose driver (``driver.pid``) is gone."""
    parent = os.path.join(root or tempfile.gettempdir(), "compass-ray")
    os.makedirs(parent, mode=0o700, exist_ok=True)
    for entry in os.listdir(parent):
        try:
            with open(os.path.join(parent, entry, "driver.pid")) as f:
                pid = int(f.read())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        except (OSError, ValueError):
            continue
    path = tempfile.mkdtemp(dir=parent)
    with open(os.path.join(path, "driver.pid"), "w") as f:
        f.write(str(os.getpid()))
    return path


#: ``ray start`` without a Ray Client server. Ray starts one on port 10001
#: whenever its client dependencies are importable and offers no switch to
#: leave it out; the runtime connects as a driver, never through Ray Client,
#: so its ``ray start`` is told the dependencies are absent.
_START = (
    "import ray.scripts.scripts as s\n"
    "s.get_ray_client_dependency_error = lambda: ImportError('no Ray Client server for a local cluster')\n"
    "s.main()"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_started(process: subprocess.Popen[bytes]) -> str:
    """Read ``ray start``'s output until the cluster is up; the output so far if it failed."""
    assert process.stdout is not None
    seen: list[str] = []
    for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        seen.append(line)
        if "Ray runtime started" in line:
            return ""
    return "\n".join(seen[-5:])


@contextlib.asynccontextmanager
async def local_cluster(cpus: int, grace: float) -> AsyncIterator[str]:
    """A loopback cluster of ``cpus`` CPUs for the block; yields its address."""
    temp_dir = _temp_dir()
    port = _free_port()
    command = [
        sys.executable,
        "-c",
        _START,
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        f"--num-cpus={cpus}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **{SINGLE_MACHINE: "0"})
    # Spawned from the driver's own (Trio) thread, not a worker thread: the
    # death signal follows the thread that forked, and a worker thread ends
    # long before the run does.
    process = subprocess.Popen(  # noqa: ASYNC220 - see above: the fork must be on this thread
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=_die_with_parent,
        start_new_session=True,
    )
    try:
        with trio.move_on_after(START_SECONDS) as timer:
            failure = await trio.to_thread.run_sync(_wait_started, process, abandon_on_cancel=True)
        if timer.cancelled_caught or failure:
            raise ConfigError(f"orchestration.executor: the local Ray cluster did not start: {failure or 'timed out'}")
        # ``ray start`` keeps writing to its output while it supervises.
        threading.Thread(target=_drain, args=(process,), name="ray-start-output", daemon=True).start()
        yield f"127.0.0.1:{port}"
    finally:
        with trio.move_on_after(grace, shield=True):
            await _stop(process)
        if process.poll() is None:
            process.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _drain(process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    for _ in process.stdout:
        pass


async def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM: ``ray start --block`` stops every process of the cluster, then exits."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    await trio.to_thread.run_sync(process.wait, abandon_on_cancel=True)
