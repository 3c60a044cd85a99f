"""Finding run directories under a directory, at any depth.

A run directory is one that holds ``run_info.json`` (or, before that is
written, ``progress.jsonl``); the search does not
descend into one (its ``tasks/`` and ``details/`` hold no runs) nor into
hidden directories. Runs may sit at any depth: ``make demo`` writes to
``runs/demo/<request>/<run id>``, a plain launch to ``runs/<request>/<run id>``.
Run ids start with their UTC start time, so the greatest id is the latest run.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._store._layout import is_run_dir

__all__ = ["find_run_dirs", "is_run_dir", "latest_run"]


def find_run_dirs(root: Path) -> list[Path]:
    """Every run directory under ``root`` (``root`` itself included), latest first."""
    found: list[Path] = []
    stack = [root]
    while stack:
        path = stack.pop()
        if is_run_dir(path):
            found.append(path)
            continue
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        stack.extend(Path(e.path) for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
    return sorted(found, key=lambda p: (p.name, str(p)), reverse=True)


def latest_run(root: Path) -> Path | None:
    """The latest run directory under ``root`` at any depth, or None."""
    runs = find_run_dirs(root)
    return runs[0] if runs else None
