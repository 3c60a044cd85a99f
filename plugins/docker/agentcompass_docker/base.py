"""A local base image, for machines that cannot pull one (``make docker-base``).

:func:`base_tarball` makes a Debian bookworm root (``debootstrap
--variant=minbase``, about 80 s) once per machine and keeps it as a tarball
under ``${XDG_CACHE_HOME:-~/.cache}/agentcompass/docker-base/``;
:func:`import_base` imports that tarball into a daemon as
:data:`BASE_IMAGE` when the daemon does not have it yet, through the Engine
API (``POST /images/create?fromSrc=-``). Task images then build ``FROM`` it
offline. Run as ``python -m agentcompass_docker.base [--host unix:///...]``:
without ``--host`` it only makes the tarball.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from agentcompass.host import FileLock

from ._api import API_VERSION, socket_path

__all__ = ["BASE_IMAGE", "base_tarball", "cache_dir", "has_image", "import_base"]

#: The name the base image is imported under.
BASE_IMAGE = "agentcompass/base:bookworm"
#: Where debootstrap fetches from (Debian's redirector).
MIRROR = "http://deb.debian.org/debian"


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/agentcompass/docker-base``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "agentcompass" / "docker-base"


def base_tarball(directory: Path | None = None) -> Path:
    """The base root filesystem as a tarball, made once per machine (blocking).

    Needs root and ``debootstrap``; concurrent callers (two test runs) wait
    for the one that makes it (a file lock), and a failed attempt leaves no
    partial tarball. Raises ``RuntimeError`` with the log's tail on failure.
    """
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    tarball = directory / "bookworm-minbase.tar"
    if tarball.exists():
        return tarball
    with FileLock.acquire(directory / ".lock"):
        if tarball.exists():
            return tarball
        if shutil.which("debootstrap") is None:
            raise RuntimeError("making the base image needs debootstrap (apt-get install debootstrap)")
        root = tempfile.mkdtemp(prefix="root.", dir=directory)
        log = directory / "debootstrap.log"
        try:
            with open(log, "wb") as out:
                made = subprocess.run(
                    ["debootstrap", "--variant=minbase", "bookworm", root, MIRROR], stdout=out, stderr=out
                )
            if made.returncode != 0:
                tail = log.read_bytes()[-2000:].decode(errors="replace")
                raise RuntimeError(f"debootstrap failed (exit {made.returncode}); the end of {log}:\n{tail}")
            part = tarball.with_suffix(".tar.part")
            subprocess.run(["tar", "-C", root, "--numeric-owner", "-cf", part, "."], check=True)
            part.rename(tarball)
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", root], check=False)
    return tarball


def _client(host: str) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=socket_path(host))
    return httpx.Client(transport=transport, base_url=f"http://docker/{API_VERSION}", timeout=600, trust_env=False)


def has_image(host: str, image: str) -> bool:
    """Whether the daemon at ``host`` has ``image`` (blocking)."""
    with _client(host) as client:
        return client.get(f"/images/{image}/json").status_code == 200


def import_base(host: str, tarball: Path | None = None, image: str = BASE_IMAGE) -> bool:
    """Import the base tarball into the daemon at ``host`` as ``image`` unless
    it is there already (blocking); return whether it imported. The tarball
    is made first when missing (:func:`base_tarball`)."""
    if has_image(host, image):
        return False
    tarball = tarball or base_tarball()
    repo, _, tag = image.rpartition(":")
    with _client(host) as client, open(tarball, "rb") as data:
        params = {"fromSrc": "-", "repo": repo, "tag": tag}
        headers = {"Content-Type": "application/x-tar"}
        response = client.post("/images/create", params=params, content=data, headers=headers)
        if response.status_code != 200 or b'"error"' in response.content:
            raise RuntimeError(f"importing {tarball} as {image} failed: {response.text[-2000:]}")
        if client.get(f"/images/{image}/json").status_code != 200:
            # Podman's compatible service names an import REPO:latest whatever the tag.
            tagged = client.post(f"/images/{repo}:latest/tag", params={"repo": repo, "tag": tag})
            if tagged.status_code not in (200, 201):
                raise RuntimeError(f"tagging the imported {repo}:latest as {image} failed: {tagged.text[-500:]}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentcompass_docker.base", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", help="import into the daemon at this unix:// socket (when it lacks the image)")
    args = parser.parse_args(argv)
    try:
        tarball = base_tarball()
        print(f"base tarball: {tarball}")
        if args.host:
            imported = import_base(args.host, tarball)
            print(f"{BASE_IMAGE}: {'imported' if imported else 'already present'} at {args.host}")
    except (RuntimeError, OSError, httpx.HTTPError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
