"""A terminal task's files, read without following a link (task directories are untrusted input), and uploaded into a session."""

from __future__ import annotations

import os
import posixpath
import shlex
import stat
from pathlib import Path

import attrs
import trio

from agentcompass import EnvironmentSession, IssueError, TaskSpec

from ._terminal_tasks import IMAGE_FILES, link_inside

__all__ = [
    "APP",
    "SOLUTION",
    "TESTS",
    "Tree",
    "run_checked",
    "solution_files",
    "starting_files",
    "test_files",
    "upload",
]

# (sandbox virtual root, environment variable naming it under ``local``)
APP = ("/app", "APP_DIR")

TESTS = ("/tests", "TESTS_DIR")

SOLUTION = ("/solution", "SOLUTION_DIR")


async def starting_files(task: TaskSpec) -> Tree:
    """What a session on the host's userland starts with: ``environment/``
    without the image's own files (none in the older layout)."""
    if task.data.get("layout") == "terminal-bench":
        return Tree([], [])
    return await _read_tree(Path(task.data["dir"]), "environment", IMAGE_FILES)


async def solution_files(task: TaskSpec) -> Tree:
    task_dir = Path(task.data["dir"])
    if task.data.get("layout") == "terminal-bench":
        return await _read_top_files(task_dir, {"solution.sh": "solve.sh"})
    return await _read_tree(task_dir, "solution")


async def test_files(task: TaskSpec) -> Tree:
    task_dir = Path(task.data["dir"])
    tree = await _read_tree(task_dir, "tests")
    if task.data.get("layout") == "terminal-bench":
        top = await _read_top_files(task_dir, {"run-tests.sh": "run-tests.sh"})
        tree = Tree(sorted([*tree.files, *top.files]), tree.links)
    return tree


@attrs.frozen
class Tree:
    """What one upload copies: regular files (relative posix path, content,
    executable) and symbolic links (relative path, target) that stay inside
    the task directory, copied as links."""

    files: list[tuple[str, bytes, bool]]
    links: list[tuple[str, str]]


async def _read_tree(task_dir: Path, sub: str, exclude: frozenset[str] = frozenset()) -> Tree:
    return await trio.to_thread.run_sync(_read_tree_sync, task_dir, sub, exclude)


def _read_tree_sync(task_dir: Path, sub: str, exclude: frozenset[str]) -> Tree:
    """Blocking: the tree ``task_dir/sub``, read without following a link.

    A task directory may change after it loaded: every directory is opened
    relative to its parent's descriptor without following links
    (``os.fwalk``) and every file with ``O_NOFOLLOW``, so nothing outside
    the task directory is read. A link that now points outside, or an entry
    swapped for a link while being read, is a FATAL ``setup_failed``; FIFOs,
    devices and sockets are left out.
    """
    top = task_dir / sub
    if top.is_symlink() or not top.is_dir():  # a link here failed the load: the task changed since
        return Tree([], [])
    task_real = os.path.realpath(task_dir)
    files: list[tuple[str, bytes, bool]] = []
    links: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in sorted([*dirnames, *filenames]):
            rel = Path(dirpath, name).relative_to(top).as_posix()
            if rel in exclude:
                continue
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(name, dir_fd=dir_fd)
                inside = link_inside(task_real, os.path.join(dirpath, name), target)
                if inside is None:
                    raise IssueError(
                        "fatal",
                        "setup_failed",
                        f"task {task_dir.name!r}: {sub}/{rel} is a symbolic link pointing outside the "
                        f"task directory ({target!r}); not copied",
                    )
                links.append((rel, inside))
            elif stat.S_ISREG(info.st_mode):
                content = _read_regular(name, dir_fd, f"task {task_dir.name!r}: {sub}/{rel}")
                executable = bool(info.st_mode & stat.S_IXUSR) or name.endswith(".sh")
                files.append((rel, content, executable))
    files.sort()
    links.sort()
    return Tree(files, links)


async def _read_top_files(task_dir: Path, names: dict[str, str]) -> Tree:
    """Top-level files of a task directory (name -> name in the session),
    read as :func:`_read_tree` reads, without following a link."""
    return await trio.to_thread.run_sync(_read_top_files_sync, task_dir, names)


def _read_top_files_sync(task_dir: Path, names: dict[str, str]) -> Tree:
    files = []
    fd = os.open(task_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name, rel in sorted(names.items()):
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                files.append((rel, _read_regular(name, fd, f"task {task_dir.name!r}: {name}"), True))
    finally:
        os.close(fd)
    return Tree(files, [])


def _read_regular(name: str, dir_fd: int, where: str) -> bytes:
    """The bytes of the regular file ``name`` in ``dir_fd``, opened without
    following a link or blocking on a FIFO put there since it was listed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise IssueError("fatal", "setup_failed", f"{where} changed while being read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IssueError("fatal", "setup_failed", f"{where} changed while being read: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


async def upload(env: EnvironmentSession, tree: Tree, root: tuple[str, str]) -> None:
    """Write the files of ``tree`` under a sandbox root, then make its links and
    mark the executable files."""
    virtual, variable = root

    def place(rel: str) -> str:
        # Quote only the relative part: the variable must still expand (local layout).
        return f'"${{{variable}:-{virtual}}}"/{shlex.quote(rel)}'

    for rel, content, _ in tree.files:
        await env.write_file(f"{virtual}/{rel}", content)
    script = [
        f"mkdir -p -- {place(posixpath.dirname(rel) or '.')} && ln -sfn -- {shlex.quote(target)} {place(rel)}"
        for rel, target in tree.links
    ]
    executables = [rel for rel, _, executable in tree.files if executable]
    if executables:
        script.append(f"chmod +x -- {' '.join(place(rel) for rel in executables)}")
    if script:
        await run_checked(env, "set -e\n" + "\n".join(script), f"copy files under {virtual}")


async def run_checked(env: EnvironmentSession, cmd: str, what: str) -> None:
    result = await env.exec(cmd)
    if result.exit_code != 0:
        detail = (result.stderr.strip().splitlines() or [""])[-1][:200]
        raise IssueError("fatal", "environment_failed", f"could not {what} (exit {result.exit_code}): {detail}")
