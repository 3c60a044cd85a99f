"""Task directories fetched with git at a pinned commit, into a
content-addressed cache reused offline.

Layout under the cache root (``~/.cache/agentcompass/datasets``, or
``AGENTCOMPASS_DATASET_CACHE``)::

    repos/<hash of the URL>.git        a bare partial clone: shallow fetches of single commits
    tasks/<hash of commit and path>/<task name>/   one task directory, as the commit holds it
    registries/<hash of the URL>.json  the last good copy of a registry URL

A task directory's key is its commit id and its path in the repository, so
it names content, not a location: once fetched, a task runs with no git
call and no network, wherever its repository has moved. A fetch asks for
the one commit at depth 1 and without file contents (``git fetch
--depth=1 --filter=blob:none origin COMMIT``, the repository a partial
clone of the URL); extracting a task then fetches only its own files, so
one task of a large repository costs its tree and its files, not the whole
checkout (a server without filters sends the whole commit instead). A
server that refuses to serve a commit by id gets one full fetch instead.
The directory is extracted with ``git archive COMMIT:PATH`` through tarfile's
``data`` filter (no link or path leaves it) into a temporary directory
renamed into place, so a killed fetch leaves nothing that looks complete.

The functions are Trio's: every ``git`` is a ``trio.run_process`` child,
killed when the caller's scope is cancelled, and each is bounded by
:data:`GIT_TIMEOUT_SECONDS`; file work runs in worker threads. Outside a
Trio run, call them through ``trio.run``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import attrs
import trio

from ..runtime import ComponentError
from ._registry_file import DatasetTask, check_name

__all__ = ["CACHE_VARIABLE", "GitPath", "cache_root", "fetch_task", "resolve_ref"]

#: The environment variable that moves the dataset cache.
CACHE_VARIABLE = "AGENTCOMPASS_DATASET_CACHE"
#: How long one git command may take.
GIT_TIMEOUT_SECONDS = 1800.0
_FULL_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}


def cache_root() -> Path:
    """Where datasets are cached: ``AGENTCOMPASS_DATASET_CACHE``, else
    ``$XDG_CACHE_HOME/agentcompass/datasets`` (``~/.cache`` by default)."""
    explicit = os.environ.get(CACHE_VARIABLE)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentcompass" / "datasets"


@attrs.frozen
class GitPath:
    """A ``path:`` of the form ``git+URL@REF#SUBDIR``: the directory
    ``SUBDIR`` (default the repository's top) of ``URL`` at ``REF`` (a
    commit, a tag or a branch; default ``HEAD``)."""

    url: str
    ref: str
    subdir: str

    @classmethod
    def parse(cls, text: str) -> GitPath:
        """Parse ``git+URL[@REF][#SUBDIR]``; :class:`ComponentError` when malformed."""
        if not text.startswith("git+"):
            raise ComponentError(f"path {text!r} is not a git+URL")
        rest, _, subdir = text[4:].partition("#")
        # The ref follows the last '@' after the URL's host part (user@host stays in the URL).
        scheme_end = rest.find("://") + 3 if "://" in rest else 0
        at = rest.rfind("@")
        slash = rest.find("/", scheme_end)
        if at > max(scheme_end, slash):
            url, ref = rest[:at], rest[at + 1 :]
        else:
            url, ref = rest, "HEAD"
        subdir = subdir.strip("/")
        if not url or url.startswith("-") or not ref or ref.startswith("-") or ".." in ref:
            raise ComponentError(f"path {text!r}: expected git+URL@REF#SUBDIR")
        if ".." in subdir.split("/") or subdir.startswith("-"):
            raise ComponentError(f"path {text!r}: SUBDIR must stay inside the repository")
        return cls(url, ref, subdir)


async def resolve_ref(url: str, ref: str) -> str:
    """The commit id ``ref`` names in ``url``: a full commit id as given,
    else asked of the repository (``git ls-remote``; a tag is peeled to its
    commit). :class:`ComponentError` when it names nothing there."""
    if _FULL_COMMIT.fullmatch(ref.lower()):
        return ref.lower()
    out = await _git(None, "ls-remote", "--", url, ref, f"refs/tags/{ref}^{{}}", what=f"resolving {ref!r} in {url}")
    found: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        found[name] = sha
    for name in (f"refs/tags/{ref}^{{}}", ref, f"refs/heads/{ref}", f"refs/tags/{ref}"):
        if name in found:
            return found[name]
    if re.fullmatch(r"[0-9a-fA-F]{7,39}", ref):
        return ref.lower()  # an abbreviated commit id: fetched, then checked
    raise ComponentError(f"{url}: no branch, tag or commit {ref!r}")


async def fetch_task(task: DatasetTask, root: Path | None = None) -> tuple[Path, str]:
    """The task directory of ``task`` in the cache (fetched on first use)
    and the commit it was taken at. The cache is read first: a task fetched
    before needs no git and no network. :class:`ComponentError` (one line)
    when the commit or the path cannot be had."""
    check_name(task.name, "task name")
    root = cache_root() if root is None else root
    commit = task.git_commit_id
    if commit == "HEAD":
        commit = await resolve_ref(task.git_url, "HEAD")
    commit = commit.lower()
    key = hashlib.sha256(f"{commit}\0{task.path}".encode()).hexdigest()[:32]
    final = root / "tasks" / key / task.name
    if await trio.to_thread.run_sync(final.is_dir):
        return final, commit
    repo = await _repository(root, task.git_url)
    where = f"task {task.name!r}: {task.git_url}"
    if not await _has_commit(repo, commit):
        try:
            await _git(
                repo, "fetch", "--quiet", "--depth=1", "--filter=blob:none", "origin", commit, what=f"fetching {commit}"
            )
        except ComponentError:
            # A server that serves no commit by id (or an abbreviated id): fetch everything once.
            try:
                await _git(
                    repo,
                    "fetch",
                    "--quiet",
                    "--filter=blob:none",
                    "origin",
                    "+refs/*:refs/fetched/*",
                    what=f"fetching {commit}",
                )
            except ComponentError as exc:
                raise ComponentError(f"{where}: {exc}") from None
        if not await _has_commit(repo, commit):
            raise ComponentError(f"{where}: commit {commit} cannot be had (not in the repository)")
    full = (await _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", what="reading")).strip()
    await _extract(repo, full, task.path, final, where)
    return final, full if len(commit) < 40 else commit


async def _repository(root: Path, url: str) -> Path:
    repo = root / "repos" / (hashlib.sha256(url.encode()).hexdigest()[:32] + ".git")
    if await trio.to_thread.run_sync((repo / "HEAD").is_file):
        return repo

    def make_temporary() -> Path:
        repo.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".init-", dir=repo.parent))

    tmp = await trio.to_thread.run_sync(make_temporary)
    try:
        await _git(None, "init", "--quiet", "--bare", str(tmp), what="creating the cache repository")
        # A partial clone of the URL: file contents are fetched when a task is extracted.
        for key, value in (
            ("remote.origin.url", url),
            ("remote.origin.promisor", "true"),
            ("remote.origin.partialclonefilter", "blob:none"),
        ):
            await _git(tmp, "config", key, value, what="configuring the cache repository")
        await trio.to_thread.run_sync(_move_into_place, tmp, repo)
    finally:
        await trio.to_thread.run_sync(_rmtree, tmp)
    return repo


def _move_into_place(tmp: Path, final: Path) -> None:
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.exists():  # else another process put it there first
            raise


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


async def _has_commit(repo: Path, commit: str) -> bool:
    result = await _run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"], "reading")
    return result.returncode == 0


async def _extract(repo: Path, commit: str, path: str, final: Path, where: str) -> None:
    """``path`` of ``commit`` as the directory ``final`` (atomically)."""

    def make_temporary() -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".fetch-", dir=final.parent))

    tmp = await trio.to_thread.run_sync(make_temporary)
    try:
        archive = await trio.to_thread.run_sync(lambda: open(tmp / "tree.tar", "w+b"))  # noqa: SIM115
        try:
            treeish = f"{commit}:{path}" if path else commit
            result = await _run(
                ["git", "-C", str(repo), "archive", "--format=tar", treeish], "archiving", stdout=archive
            )
            if result.returncode != 0:
                raise ComponentError(f"{where}: path {path!r} is not a directory at commit {commit}")
            await trio.to_thread.run_sync(
                _untar, archive, tmp / "tree", f"{where}: cannot extract {path!r} at {commit}"
            )
        finally:
            archive.close()
        await trio.to_thread.run_sync(_move_into_place, tmp / "tree", final)
    finally:
        await trio.to_thread.run_sync(_rmtree, tmp)


def _untar(archive: Any, out: Path, what: str) -> None:
    """Blocking: the tar ``archive`` into the new directory ``out``; no member leaves it."""
    archive.seek(0)
    out.mkdir()
    try:
        with tarfile.open(fileobj=archive, mode="r:") as tar:
            tar.extractall(out, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise ComponentError(f"{what}: {exc}") from None


async def _run(command: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """``command`` as a Trio child (killed if the caller is cancelled), within :data:`GIT_TIMEOUT_SECONDS`."""
    if "stdout" not in kwargs:
        kwargs["capture_stdout"] = True
    try:
        with trio.fail_after(GIT_TIMEOUT_SECONDS):
            return await trio.run_process(
                command, env={**os.environ, **_GIT_ENV}, capture_stderr=True, check=False, **kwargs
            )
    except FileNotFoundError:
        raise ComponentError("datasets need the git program, which is not installed") from None
    except trio.TooSlowError:
        raise ComponentError(f"{what}: git took over {GIT_TIMEOUT_SECONDS:.0f}s") from None


async def _git(repo: Path | None, *args: str, what: str) -> str:
    """Run ``git`` (in ``repo``); its stdout, or :class:`ComponentError` with its last error line."""
    result = await _run(["git", *(["-C", str(repo)] if repo is not None else []), *args], what)
    if result.returncode != 0:
        lines = [line for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]
        detail = lines[-1].strip()[:300] if lines else f"git exited {result.returncode}"
        raise ComponentError(f"{what}: {detail}")
    return result.stdout.decode(errors="replace")
