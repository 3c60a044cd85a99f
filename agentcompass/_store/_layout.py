"""The run directory's layout (SPEC 8): every file and folder name in it.

::

    <run dir>/
      run_info.json  progress.jsonl  progress.json  sessions.jsonl  index.jsonl
      log.jsonl  metrics.json  summary.md
      details/{fatal,error,normal}/<task key>.json
      tasks/<task key>/attempt-<n>/plan.json
      tasks/<task key>/attempt-<n>/checkpoint.json
      tasks/<task key>/attempt-<n>/retries/<try>.json
      tasks/<task key>/attempt-<n>/logs/            (logs/build.log: an image build's output)
      tasks/<task key>/attempt-<n>/agent/trajectory.json
      tasks/<task key>/attempt-<n>/trajectory/<i>.json   a long trajectory's chunks

A :class:`RunLayout` names each path of one run directory; the writer
(``_run_store``), the reader (``_reader``), the viewer, the reports and the
CLI ask it and spell no name themselves. Paths are ``str`` (the writer joins
thousands a second; ``pathlib`` costs more) built with ``/``: the store runs
on POSIX only. The run directory's writer lock is an ``flock`` on the
directory itself (``_disk.Disk.lock``): it has no file of its own.

Non-goal: task keys. A layout takes a key (``_keys.task_key``) where a
task's path needs one; it never encodes or decodes task ids.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import attrs

__all__ = ["SEVERITIES", "RunLayout", "attempt_number", "has_run_info", "is_run_dir", "record_key"]

#: The severities a countable record is filed under, worst first.
SEVERITIES = ("fatal", "error", "normal")

_RUN_INFO = "run_info.json"
_PROGRESS_LINES = "progress.jsonl"
_ATTEMPT = re.compile(r"attempt-(\d+)")
_JSON = ".json"


def attempt_number(name: str) -> int | None:
    """The ``n`` of an ``attempt-<n>`` directory name, else None."""
    match = _ATTEMPT.fullmatch(name)
    return int(match.group(1)) if match else None


def record_key(name: str) -> str | None:
    """The task key of a record's (or a retry's) file name ``<key>.json``, else None."""
    return name[: -len(_JSON)] if name.endswith(_JSON) else None


def is_run_dir(path: Path | str) -> bool:
    """Whether ``path`` is a run directory: it holds ``run_info.json`` or,
    before that is written, ``progress.jsonl``."""
    return os.path.isfile(os.path.join(path, _RUN_INFO)) or os.path.isfile(os.path.join(path, _PROGRESS_LINES))


def has_run_info(path: Path | str) -> bool:
    """Whether ``path`` holds a ``run_info.json`` (a run that got past its start)."""
    return os.path.isfile(os.path.join(path, _RUN_INFO))


def _text(path: str | os.PathLike[str]) -> str:
    return os.fspath(path)


@attrs.frozen
class RunLayout:
    """Every path of the run directory ``root`` (see the module doc)."""

    root: str = attrs.field(converter=_text)

    @property
    def run_dir(self) -> Path:
        return Path(self.root)

    # -- files of the run ---------------------------------------------------

    @property
    def run_info(self) -> str:
        return f"{self.root}/{_RUN_INFO}"

    @property
    def progress_lines(self) -> str:
        """``progress.jsonl``: one event a line."""
        return f"{self.root}/{_PROGRESS_LINES}"

    @property
    def progress(self) -> str:
        """``progress.json``: the rewritten snapshot."""
        return f"{self.root}/progress.json"

    @property
    def sessions(self) -> str:
        return f"{self.root}/sessions.jsonl"

    @property
    def index(self) -> str:
        """``index.jsonl``: a summary line per record saved (see ``_index``)."""
        return f"{self.root}/index.jsonl"

    @property
    def log(self) -> str:
        """``log.jsonl``: the run's structured log."""
        return f"{self.root}/log.jsonl"

    @property
    def metrics(self) -> str:
        return f"{self.root}/metrics.json"

    @property
    def summary(self) -> str:
        return f"{self.root}/summary.md"

    @property
    def details(self) -> str:
        return f"{self.root}/details"

    @property
    def tasks(self) -> str:
        return f"{self.root}/tasks"

    def shown(self) -> dict[str, str]:
        """The files ``compass show`` lists, by short name."""
        return {
            "run_info": self.run_info, "metrics": self.metrics, "summary": self.summary,
            "progress": self.progress, "log": self.log, "details": self.details,
        }  # fmt: skip

    # -- records --------------------------------------------------------------

    def severity_dir(self, severity: str) -> str:
        return f"{self.root}/details/{severity}"

    def record(self, severity: str, key: str) -> str:
        """``details/<severity>/<key>.json``: a task's countable record."""
        return f"{self.root}/details/{severity}/{key}{_JSON}"

    # -- a task's attempts ------------------------------------------------------

    def task_dir(self, key: str) -> str:
        return f"{self.root}/tasks/{key}"

    def attempt_dir(self, key: str, attempt: int) -> str:
        return f"{self.root}/tasks/{key}/attempt-{attempt}"

    def plan(self, key: str, attempt: int) -> str:
        """The attempt's plan, durable before its environment opens."""
        return f"{self.root}/tasks/{key}/attempt-{attempt}/plan.json"

    def checkpoint(self, key: str, attempt: int) -> str:
        """An evaluated attempt of a task that has no record yet."""
        return f"{self.root}/tasks/{key}/attempt-{attempt}/checkpoint.json"

    def retries(self, key: str, attempt: int) -> str:
        return f"{self.root}/tasks/{key}/attempt-{attempt}/retries"

    def retry(self, key: str, attempt: int, try_number: int) -> str:
        """A discarded try."""
        return f"{self.root}/tasks/{key}/attempt-{attempt}/retries/{try_number}{_JSON}"

    def logs(self, key: str, attempt: int) -> str:
        """What the verifier and the agent left in ``/logs`` (redacted)."""
        return f"{self.root}/tasks/{key}/attempt-{attempt}/logs"

    def build_log(self, key: str, attempt: int) -> str:
        """An image build's output, without terminal escapes."""
        return f"{self.root}/tasks/{key}/attempt-{attempt}/logs/build.log"

    def agent_trajectory(self, key: str, attempt: int) -> str:
        """The attempt's trajectory in ATIF."""
        return f"{self.root}/tasks/{key}/attempt-{attempt}/agent/trajectory.json"

    def chunks(self, key: str, attempt: int) -> str:
        """The directory of a long trajectory's chunks (see ``_trajectories``)."""
        return f"{self.root}/tasks/{key}/attempt-{attempt}/trajectory"

    def chunk(self, key: str, attempt: int, index: int) -> str:
        return f"{self.root}/tasks/{key}/attempt-{attempt}/trajectory/{index}{_JSON}"

    def checkpoints_in(self, names: list[str], key: str) -> list[str]:
        """The checkpoint paths of the attempt directories among ``names``
        (a listing of ``tasks/<key>``)."""
        return [self.checkpoint(key, n) for n in map(attempt_number, names) if n is not None]

    def relative(self, path: str) -> str:
        """``path`` relative to the run directory, for a note naming a file."""
        return path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path
