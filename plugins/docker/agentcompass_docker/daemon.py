"""Run a command against a Docker daemon that has the base image: ``make demo-docker``.

``python -m agentcompass_docker.daemon -- COMMAND [ARG ...]`` uses the daemon
at ``DOCKER_HOST`` (else ``unix:///var/run/docker.sock``) when one answers
there; otherwise, as root with ``dockerd`` installed, it starts a private one
(:class:`~agentcompass_docker.testing.PrivateDaemon`: its own directory and
socket, nothing shared with another daemon) for the command's lifetime. It
imports :data:`~agentcompass_docker.base.BASE_IMAGE` when the daemon lacks it
(made once per machine, see :mod:`agentcompass_docker.base`), runs COMMAND
with ``DOCKER_HOST`` set to that daemon, stops a private daemon after, and
exits with COMMAND's exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx

from ._api import API_VERSION, socket_path
from .base import import_base
from .testing import PrivateDaemon, daemon_problem

__all__ = ["daemon_host", "main"]

DEFAULT_HOST = "unix:///var/run/docker.sock"


def _answers(host: str) -> bool:
    try:
        transport = httpx.HTTPTransport(uds=socket_path(host))
        with httpx.Client(transport=transport, base_url=f"http://docker/{API_VERSION}", timeout=5) as client:
            return client.get("/_ping").status_code == 200
    except (httpx.HTTPError, OSError, ValueError):
        return False


@contextlib.contextmanager
def daemon_host() -> Iterator[str]:
    """The ``unix://`` address of a daemon with the base image: the user's, or a private one until exit."""
    host = os.environ.get("DOCKER_HOST") or DEFAULT_HOST
    if _answers(host):
        import_base(host)
        yield host
        return
    problem = daemon_problem()
    if problem is not None:
        raise RuntimeError(f"no Docker daemon answers at {host}, and a private one cannot start: {problem}")
    daemon = PrivateDaemon.start()
    try:
        import_base(daemon.host)
        yield daemon.host
    finally:
        daemon.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentcompass_docker.daemon", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    try:
        with daemon_host() as host:
            print(f"docker daemon: {host}", file=sys.stderr)
            return subprocess.run(command, env={**os.environ, "DOCKER_HOST": host}).returncode
    except (RuntimeError, OSError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
