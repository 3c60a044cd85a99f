"""A dataset by name, or a git path, made into task directories on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio

from ..runtime import ComponentError
from ._git import GitPath, cache_root, fetch_task, resolve_ref
from ._known import known_benchmark
from ._registry_file import (
    Dataset,
    DatasetTask,
    find_dataset,
    read_registry,
    registry_copy,
    registry_source,
    split_spec,
)

__all__ = ["PulledDataset", "declared", "pull_dataset", "pull_git_path"]


@attrs.frozen
class PulledDataset:
    """A dataset whose tasks are on disk: ``directories`` (one per task, named
    by the task), the ``commits`` each task was taken at, and the
    ``registry`` it was resolved through."""

    dataset: Dataset
    registry: str
    directories: tuple[Path, ...]
    commits: dict[str, str]

    @property
    def series(self) -> tuple[str, ...] | None:
        """The series the dataset's metadata or the built-in table declares (None: the benchmark's own)."""
        declared = self.dataset.metadata.get("series")
        if isinstance(declared, list) and declared and all(isinstance(s, str) and s for s in declared):
            return tuple(declared)
        row = known_benchmark(self.dataset.name, self.dataset.version)
        return row.series if row is not None else None

    @property
    def evaluation_timeout_values(self) -> dict[str, Any] | None:
        """The values recorded on evaluation timeout, as :attr:`series` is found."""
        declared = self.dataset.metadata.get("evaluation_timeout_values")
        if isinstance(declared, dict) and all(
            isinstance(v, bool | int | float) or v is None for v in declared.values()
        ):
            return {str(k): v for k, v in declared.items()}
        row = known_benchmark(self.dataset.name, self.dataset.version)
        return dict(row.evaluation_timeout_values) if row is not None else None

    def record(self) -> dict[str, Any]:
        """What ``run_info.json`` records: the registry, ``name@version`` and every resolved commit."""
        return {
            "registry": self.registry,
            "dataset": self.dataset.spec,
            "tasks": {
                task.name: {"git_url": task.git_url, "path": task.path, "commit": self.commits[task.name]}
                for task in self.dataset.tasks
            },
        }


async def pull_dataset(spec: str, registry: str | None = None, root: Path | None = None) -> PulledDataset:
    """Resolve ``NAME@VERSION`` through ``registry`` (see
    :func:`~agentcompass.datasets.registry_source`) and fetch every task at
    its pinned commit into the cache (Trio; cancellable). :class:`ComponentError`
    (one line) when the dataset or a commit cannot be had."""
    root = cache_root() if root is None else root
    source = registry_source(registry)
    datasets = await trio.to_thread.run_sync(read_registry, source, root)
    dataset = find_dataset(datasets, spec, source)
    directories, commits = [], {}
    for task in dataset.tasks:
        directory, commit = await fetch_task(task, root)
        directories.append(directory)
        commits[task.name] = commit
    return PulledDataset(dataset, source, tuple(directories), commits)


async def pull_git_path(text: str, root: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The directory ``git+URL@REF#SUBDIR`` names, fetched into the cache
    (Trio; cancellable), and its record for ``run_info.json`` (the ref
    resolved to its commit)."""
    where = GitPath.parse(text)
    commit = await resolve_ref(where.url, where.ref)
    directory, commit = await fetch_task(DatasetTask("tree", where.url, commit, where.subdir), root)
    return directory, {"git_url": where.url, "ref": where.ref, "path": where.subdir, "commit": commit}


def declared(spec: str, registry: str | None = None, root: Path | None = None) -> tuple[tuple[str, ...] | None, Any]:
    """The series and evaluation-timeout values of dataset ``spec``
    (``(None, None)``: the benchmark's own), without the network: from the
    registry when it is a file or a URL read before (its cached copy), else
    from the built-in table. Checks the spec's form; never raises for a
    registry it cannot read here."""
    name, version = split_spec(spec)
    root = cache_root() if root is None else root
    source = registry_source(registry)
    dataset = None
    try:
        if source.startswith(("http://", "https://")):
            kept = registry_copy(source, root)
            if kept.is_file():
                dataset = find_dataset(read_registry(str(kept)), spec, source)
        else:
            dataset = find_dataset(read_registry(source), spec, source)
    except ComponentError:
        dataset = None
    if dataset is None:
        row = known_benchmark(name, version or "")
        return (row.series, dict(row.evaluation_timeout_values)) if row is not None else (None, None)
    pulled = PulledDataset(dataset, source, (), {})
    return pulled.series, pulled.evaluation_timeout_values
