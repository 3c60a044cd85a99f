"""One batch of writes made durable in one blocking call (see :mod:`._run_store`).

:func:`commit` runs in the disk's worker (:meth:`Disk.run <._disk.Disk.run>`):

1. append the journal lines, create missing directories, write every
   replacement to a hidden temporary file next to its target;
2. one sync of all of that;
3. rename every temporary file over its target;
4. one sync of the directories;
5. remove what the writes supersede (not synced: if a crash undoes a
   removal, readers still prefer the newer file, see :mod:`._load`).

Each write ends with ``error`` None (durable) or set; one failing file fails
alone, a failing sync fails every write it covered. A crash before step 3
leaves old content and temporary files readers skip.
"""

from __future__ import annotations

import contextlib
import os

import attrs
import trio

from ._disk import Disk, temp_name
from ._layout import RunLayout

__all__ = ["Write", "commit", "link"]


@attrs.define(eq=False, slots=True)
class Write:
    """Replace ``path`` by ``data``, or append ``data`` to it (``append``)."""

    path: str
    data: bytes
    append: bool = False
    #: Files to remove once this write is durable.
    remove: tuple[str, ...] = ()
    #: A task (its run's layout, its key) whose checkpoints to remove then (found by listing its directory).
    sweep: tuple[RunLayout, str] | None = None
    #: Set once the write is done, for a caller that waits (None: nobody does).
    done: trio.Event | None = None
    error: Exception | None = None
    #: The appended data is in the file (it may not be durable yet).
    written: bool = False


def commit(disk: Disk, writes: list[Write], known_dirs: set[str]) -> list[str]:
    """Steps 1-5 (blocking). ``known_dirs`` are directories known durable (it
    grows by those this batch creates). Returns a note per failed removal."""
    synced: list[str] = []
    appends: dict[str, list[Write]] = {}
    for write in writes:
        if write.append:
            appends.setdefault(write.path, []).append(write)
    for path, group in appends.items():  # one append per file, in queue order
        try:
            disk.append(path, b"".join(w.data for w in group if not w.written))
        except OSError as exc:
            _fail(group, exc)
        else:
            for write in group:
                write.written = True
            synced.append(path)
    dirs: dict[str, None] = {}  # an ordered set: directories to sync
    new_dirs: set[str] = set()  # a set: a batch of new attempts makes two directories each
    temps: list[tuple[Write, str, str]] = []
    for write in writes:
        if write.append:
            continue
        parent, name = os.path.split(write.path)
        tmp = os.path.join(parent, temp_name(name))
        try:
            _make_dirs(disk, parent, known_dirs, dirs, new_dirs)
            disk.write(tmp, write.data)
        except OSError as exc:
            write.error = exc
            continue
        temps.append((write, tmp, parent))
        synced.append(tmp)
    try:
        disk.sync(synced)
    except OSError as exc:
        _fail(writes, exc)
        for _, tmp, _ in temps:
            _unlink_quietly(disk, tmp)
        return []
    renamed: list[Write] = []
    for write, tmp, parent in temps:
        try:
            disk.replace(tmp, write.path)
        except OSError as exc:
            write.error = exc
            _unlink_quietly(disk, tmp)
        else:
            renamed.append(write)
            dirs[parent] = None
    try:
        disk.sync(dirs)
    except OSError as exc:  # rare (EIO): none of the renames is known durable
        _fail(renamed, exc)
        return []
    known_dirs.update(new_dirs)
    return remove_superseded(disk, renamed)


def remove_superseded(disk: Disk, renamed: list[Write]) -> list[str]:
    """Step 5 for the durable ``renamed``; a note per file not removed."""
    notes = []
    for write in renamed:
        paths = list(write.remove)
        if write.sweep is not None:
            layout, key = write.sweep
            paths += layout.checkpoints_in(disk.listdir(layout.task_dir(key)), key)
        for path in paths:
            try:
                disk.unlink(path)
            except OSError as exc:
                notes.append(f"after writing {write.path}: {exc}")
    return notes


def link(disk: Disk, targets: list[tuple[str, str]]) -> set[int]:
    """Hard-link each ``(source, target)``, then sync the targets' directories
    (blocking); returns the indexes that could not be linked."""
    failed: set[int] = set()
    dirs: dict[str, None] = {}
    for index, (source, target) in enumerate(targets):
        try:
            disk.link(source, target)
        except OSError:
            failed.add(index)
        else:
            dirs[os.path.dirname(target)] = None
    disk.sync(dirs)
    return failed


def _make_dirs(disk: Disk, path: str, known: set[str], dirs: dict[str, None], new_dirs: set[str]) -> None:
    """Create ``path`` and its missing parents; each one's parent needs a sync."""
    parent = os.path.dirname(path)
    if path in known or path in new_dirs or parent == path:
        return
    _make_dirs(disk, parent, known, dirs, new_dirs)
    disk.mkdir(path)  # one that exists is not known durable: sync its parent anyway
    dirs[parent] = None
    new_dirs.add(path)


def _fail(writes: list[Write], exc: Exception) -> None:
    for write in writes:
        if write.error is None:
            write.error = exc


def _unlink_quietly(disk: Disk, path: str) -> None:
    with contextlib.suppress(OSError):
        disk.unlink(path)
