"""A private Docker daemon for tests, and the pytest fixtures built on it.

:class:`PrivateDaemon` starts ``dockerd`` as root with its data root, exec
root, pid file and socket in a short temporary directory, without a default
socket, and an address pool of its own (a ``10.x.0.0/16`` no route of this
host uses), so it neither touches nor fights another daemon on the machine.
It changes nothing on the host it did not make (SPEC 12 "Host safety"): its
default bridge is a bridge of its own (``pdk`` + 8 hex digits, on another
free ``10.x.0.0/24``), made before the daemon starts and deleted after it
stops (``dockerd --bridge=none`` would delete an existing ``docker0``); no
iptables or ip6tables rule, no masquerading, no forwarding sysctl
(``--iptables=false --ip6tables=false --ip-masq=false --ip-forward=false``).
:meth:`PrivateDaemon.stop` removes what is left in it, stops it, deletes
its bridge and removes the directory.

Installed with the plugin, this module is a pytest plugin (entry point
``pytest11``): the session-scoped fixture ``docker_daemon`` starts one
daemon for the whole test session with :data:`~agentcompass_docker.base.BASE_IMAGE`
imported (made once per machine, see :mod:`agentcompass_docker.base`), and
skips with one line where that cannot be done (not root, no ``dockerd``, no
``debootstrap``). At the end of the session it fails the run if a container
or network labelled by the provider is left. :meth:`PrivateDaemon.test_image`
builds a test's own image ``FROM`` the base once per content and machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx

from ._api import API_VERSION
from ._images import context_tar, repository_name
from ._session import SESSION_LABEL
from .base import cache_dir, import_base

__all__ = ["PrivateDaemon", "daemon_problem", "docker_daemon"]

#: How long the daemon may take to answer its first ping.
START_SECONDS = 60.0


def daemon_problem() -> str | None:
    """Why this host cannot start a private daemon (one line), or ``None``."""
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    if shutil.which("dockerd") is None:
        return "no dockerd on PATH (apt-get install docker.io)"
    return None


def _free_prefixes(count: int) -> list[str]:
    """``count`` distinct ``10.x`` prefixes that no address or route of this host is in."""
    used = subprocess.run(["ip", "-o", "route"], capture_output=True, text=True).stdout
    used += subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    candidates = list(range(160, 250))
    random.shuffle(candidates)
    free = [f"10.{x}" for x in candidates if f"10.{x}." not in used]
    if len(free) < count:
        raise RuntimeError("no free 10.x.0.0/16 for a private docker daemon")
    return free[:count]


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")


@attrs.define(eq=False)
class PrivateDaemon:
    """A ``dockerd`` of the caller's own (see the module docstring)."""

    directory: str
    process: subprocess.Popen[bytes]
    #: The daemon's default bridge, made (and deleted) by this object.
    bridge: str | None = None

    @property
    def host(self) -> str:
        """The daemon's ``unix://`` address (what the provider's ``host`` takes)."""
        return f"unix://{self.directory}/docker.sock"

    @classmethod
    def start(cls) -> PrivateDaemon:
        """Start it and wait until it answers (blocking)."""
        directory = tempfile.mkdtemp(prefix="acd", dir="/tmp")
        pool, own = _free_prefixes(2)
        bridge = f"pdk{secrets.token_hex(4)}"
        try:
            _ip("link", "add", "name", bridge, "type", "bridge")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        try:
            _ip("addr", "add", f"{own}.0.1/24", "dev", bridge)
            log = open(os.path.join(directory, "log"), "wb")  # noqa: SIM115 - the daemon writes it until stop
            args = [
                "dockerd",
                f"--data-root={directory}/data",
                f"--exec-root={directory}/exec",
                f"--pidfile={directory}/pid",
                f"-H=unix://{directory}/docker.sock",
                f"--bridge={bridge}",
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--ip-forward=false",
                "--storage-driver=overlay2",
                f"--default-address-pool=base={pool}.0.0/16,size=24",
            ]
            env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
            process = subprocess.Popen(args, stdout=log, stderr=log, env=env, start_new_session=True)
            log.close()
        except BaseException:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
            shutil.rmtree(directory, ignore_errors=True)
            raise
        daemon = cls(directory, process, bridge)
        try:
            daemon._wait_ready()
        except BaseException:
            daemon.stop()
            raise
        return daemon

    def _client(self, timeout: float = 30) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=f"{self.directory}/docker.sock")
        return httpx.Client(transport=transport, base_url=f"http://docker/{API_VERSION}", timeout=timeout)

    def _wait_ready(self) -> None:
        # Only the daemon shows when it is ready: ask it, a bounded number of times.
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.process.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError), self._client(2) as client:
                if client.get("/_ping").status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"dockerd did not answer within {START_SECONDS}s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            with open(os.path.join(self.directory, "log"), "rb") as log:
                return log.read()[-1500:].decode(errors="replace")
        except OSError:
            return ""

    def leftovers(self) -> list[str]:
        """Names of the containers and networks labelled by the provider."""
        filters = json.dumps({"label": [SESSION_LABEL]})
        with self._client() as client:
            containers = client.get("/containers/json", params={"all": "1", "filters": filters}).json()
            networks = client.get("/networks", params={"filters": filters}).json()
        return [c["Names"][0].lstrip("/") for c in containers] + [f"network {n['Name']}" for n in networks]

    def test_image(self, name: str, context: str | os.PathLike[str]) -> str:
        """The image built from ``context`` (a directory with a ``Dockerfile``),
        tagged ``agentcompass/<name>:<hash of the context>`` (blocking).

        Built once per content and machine: the first build is saved under
        :func:`~agentcompass_docker.base.cache_dir` and loaded by later test
        sessions' daemons. The build runs on the host's network (the daemon
        neither masquerades nor forwards), so its ``RUN`` steps reach the package mirrors.
        """

        with tempfile.TemporaryFile() as spool:
            digest = context_tar(Path(context), spool)
            tag = f"agentcompass/{repository_name(name)}:{digest[:20]}"
            saved = cache_dir() / "images" / f"{repository_name(name)}-{digest[:20]}.tar"
            with self._client(600) as client:
                if client.get(f"/images/{tag}/json").status_code == 200:
                    return tag
                if saved.exists():
                    with open(saved, "rb") as data:
                        client.post("/images/load", params={"quiet": "1"}, content=data).raise_for_status()
                    if client.get(f"/images/{tag}/json").status_code == 200:
                        return tag
                spool.seek(0)
                params = {"t": tag, "rm": "1", "forcerm": "1", "networkmode": "host"}
                built = client.post(
                    "/build", params=params, content=spool.read(), headers={"Content-Type": "application/x-tar"}
                )
                if built.status_code != 200 or b'"error"' in built.content:
                    raise RuntimeError(f"building {tag} failed: {built.text[-2000:]}")
                saved.parent.mkdir(parents=True, exist_ok=True)
                part = saved.with_suffix(f".{os.getpid()}.part")
                with client.stream("GET", f"/images/{tag}/get") as image, open(part, "wb") as out:
                    image.raise_for_status()
                    for chunk in image.iter_bytes():
                        out.write(chunk)
                part.rename(saved)
        return tag

    def stop(self) -> None:
        """Remove every container and network, stop the daemon, remove its directory (blocking)."""
        if self.process.poll() is None:
            with contextlib.suppress(httpx.HTTPError), self._client() as client:
                for container in client.get("/containers/json", params={"all": "1"}).json():
                    client.delete(f"/containers/{container['Id']}", params={"force": "1", "v": "1"})
                for network in client.get("/networks").json():
                    if network["Name"] not in ("none", "host", "bridge"):
                        client.delete(f"/networks/{network['Id']}")
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.bridge is not None:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        # Overlay mounts a killed daemon may have left under its directory.
        with open("/proc/self/mounts") as mounts:
            points = [line.split()[1] for line in mounts if line.split()[1].startswith(self.directory + "/")]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", self.directory], check=False)


try:
    import pytest
except ImportError:  # pragma: no cover - the module is usable without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture(scope="session")
    def docker_daemon() -> Iterator[Any]:
        """One private daemon for the test session, with :data:`BASE_IMAGE`
        imported; skips with one line where none can be started."""
        problem = daemon_problem()
        if problem is not None:
            pytest.skip(problem)
        if shutil.which("debootstrap") is None and not (cache_dir() / "bookworm-minbase.tar").exists():
            pytest.skip("no debootstrap to make the base image (apt-get install debootstrap)")
        daemon = PrivateDaemon.start()
        try:
            import_base(daemon.host)
            yield daemon
            left = daemon.leftovers()
            if left:
                pytest.fail(f"the docker tests left {len(left)} container(s)/network(s): {', '.join(left[:10])}")
        finally:
            daemon.stop()
