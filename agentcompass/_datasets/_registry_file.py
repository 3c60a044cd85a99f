"""A registry of datasets in Harbor's ``registry.json`` format, read as
Harbor writes it.

The file is a JSON list of datasets, each ``{"name", "version",
"description", "tasks": [{"name", "git_url", "git_commit_id", "path"}]}``;
other keys (Harbor's ``metrics``, a ``metadata`` object) are kept, never an
error. A registry is a file path or an ``http(s)`` URL: ``registry:`` in the
``terminal`` config, else ``AGENTCOMPASS_REGISTRY``, else Harbor's public
registry. A URL's last good copy is kept in the dataset cache and used when
the URL cannot be reached, so a dataset that was run once runs offline.

Names and versions become path components of the cache and of run
directories' records: both are checked (``[A-Za-z0-9][A-Za-z0-9._+-]*``,
no ``..``); a task name the same way, since it becomes a task directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import attrs

from ..runtime import ComponentError

__all__ = [
    "DEFAULT_REGISTRY",
    "REGISTRY_VARIABLE",
    "Dataset",
    "DatasetTask",
    "find_dataset",
    "read_registry",
    "registry_copy",
    "registry_source",
    "split_spec",
]

#: Harbor's public registry: what ``dataset:`` resolves through by default.
DEFAULT_REGISTRY = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"
#: The environment variable naming the registry when the config names none.
REGISTRY_VARIABLE = "AGENTCOMPASS_REGISTRY"
#: The largest registry read (Harbor's own is a few MiB).
MAX_REGISTRY_BYTES = 64 << 20

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
_COMMIT = re.compile(r"[0-9a-fA-F]{7,64}")


def check_name(value: Any, what: str) -> str:
    """``value`` if it is safe as one path component, else :class:`ComponentError`."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise ComponentError(f"{what} {value!r} is not a valid name (letters, digits, '.', '_', '+', '-'; no '..')")
    return value


@attrs.frozen
class DatasetTask:
    """One task of a dataset: the directory ``path`` of the git repository
    ``git_url`` at commit ``git_commit_id``; ``name`` is its task id."""

    name: str
    git_url: str
    git_commit_id: str
    path: str


@attrs.frozen
class Dataset:
    """A registry entry. ``metadata`` may declare ``series`` (a list of
    metric names) and ``evaluation_timeout_values`` (values recorded when a
    task's evaluation times out), which the ``terminal`` benchmark uses."""

    name: str
    version: str
    description: str
    tasks: tuple[DatasetTask, ...]
    metadata: dict[str, Any] = attrs.field(factory=dict)

    @property
    def spec(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"


def split_spec(spec: str) -> tuple[str, str | None]:
    """``NAME@VERSION`` (or ``NAME``: the latest version) as ``(name, version)``, checked."""
    if not isinstance(spec, str):
        raise ComponentError(f"dataset must be a string NAME@VERSION, got {spec!r}")
    name, sep, version = spec.partition("@")
    check_name(name, "dataset name")
    if sep:
        check_name(version, f"dataset {name!r} version")
        return name, version
    return name, None


def registry_source(configured: str | None) -> str:
    """The registry to read: the config's, else ``AGENTCOMPASS_REGISTRY``, else Harbor's."""
    return configured or os.environ.get(REGISTRY_VARIABLE) or DEFAULT_REGISTRY


def read_registry(source: str, cache: Path | None = None) -> list[Dataset]:
    """The datasets of the registry ``source`` (a file path or an http(s)
    URL), blocking. A URL's copy is kept under ``cache`` and read when the
    URL fails. Raises :class:`ComponentError` (one line) when it cannot be
    read or is not a registry."""
    if source.startswith(("http://", "https://")):
        raw = _fetch_url(source, cache)
    else:
        path = Path(source[len("file://") :] if source.startswith("file://") else source).expanduser()
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_REGISTRY_BYTES + 1)
        except OSError as exc:
            raise ComponentError(f"registry {source!r} cannot be read: {exc.strerror or exc}") from None
        if len(raw) > MAX_REGISTRY_BYTES:
            raise ComponentError(f"registry {source!r} is larger than {MAX_REGISTRY_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ComponentError(f"registry {source!r} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("datasets"), list):
        data = data["datasets"]
    if not isinstance(data, list):
        raise ComponentError(f"registry {source!r} must be a JSON list of datasets")
    return [_dataset(entry, f"registry {source!r} entry {i}") for i, entry in enumerate(data)]


def find_dataset(datasets: list[Dataset], spec: str, source: str) -> Dataset:
    """The dataset ``NAME@VERSION`` names (``NAME`` alone: its latest version)."""
    name, version = split_spec(spec)
    named = [d for d in datasets if d.name == name]
    if not named:
        raise ComponentError(f"dataset {name!r} is not in registry {source!r}")
    if version is None:
        return max(named, key=lambda d: _version_key(d.version))
    for dataset in named:
        if dataset.version == version:
            return dataset
    known = ", ".join(sorted(d.version for d in named))
    raise ComponentError(f"dataset {name!r} has no version {version!r} in registry {source!r} (it has {known})")


def _version_key(version: str) -> tuple[Any, ...]:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+-]", version))


def _dataset(entry: Any, where: str) -> Dataset:
    if not isinstance(entry, dict):
        raise ComponentError(f"{where} must be an object")
    name = check_name(entry.get("name"), f"{where}: name")
    version = check_name(str(entry.get("version", "")), f"{where} ({name}): version")
    where = f"dataset {name}@{version}"
    tasks = entry.get("tasks")
    if not isinstance(tasks, list):
        raise ComponentError(f"{where}: tasks must be a list")
    parsed = []
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        if not isinstance(task, dict):
            raise ComponentError(f"{where}: tasks[{i}] must be an object")
        task_name = check_name(task.get("name"), f"{where}: tasks[{i}] name")
        if task_name in seen:
            raise ComponentError(f"{where}: task {task_name!r} is listed twice")
        seen.add(task_name)
        url = task.get("git_url")
        if not isinstance(url, str) or not url or url.startswith("-"):
            raise ComponentError(f"{where}: task {task_name!r} has no git_url")
        commit = task.get("git_commit_id") or "HEAD"
        if not isinstance(commit, str) or not (commit == "HEAD" or _COMMIT.fullmatch(commit)):
            raise ComponentError(f"{where}: task {task_name!r} git_commit_id {commit!r} is not a commit id")
        path = task.get("path", "")
        if not isinstance(path, str) or ".." in path.split("/") or path.startswith(("/", "-")):
            raise ComponentError(f"{where}: task {task_name!r} path {path!r} is not a path inside its repository")
        parsed.append(DatasetTask(task_name, url, commit, path.strip("/")))
    metadata = entry.get("metadata")
    description = entry.get("description")
    return Dataset(
        name,
        version,
        description if isinstance(description, str) else "",
        tuple(parsed),
        dict(metadata) if isinstance(metadata, dict) else {},
    )


def registry_copy(url: str, cache: Path) -> Path:
    """Where the last good copy of the registry ``url`` is kept under the cache ``cache``."""
    return cache / "registries" / (hashlib.sha256(url.encode()).hexdigest()[:32] + ".json")


def _fetch_url(url: str, cache: Path | None) -> bytes:
    import httpx

    kept = registry_copy(url, cache) if cache else None
    try:
        with httpx.Client(timeout=httpx.Timeout(30.0, connect=10.0), follow_redirects=True) as client:
            with client.stream("GET", url) as response:
                response.raise_for_status()
                chunks, size = [], 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > MAX_REGISTRY_BYTES:
                        raise ComponentError(f"registry {url!r} is larger than {MAX_REGISTRY_BYTES} bytes")
                    chunks.append(chunk)
        raw = b"".join(chunks)
    except httpx.HTTPError as exc:
        if kept is not None and kept.is_file():
            return kept.read_bytes()
        raise ComponentError(f"registry {url!r} cannot be read: {exc}") from None
    if kept is not None:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(raw)
        os.replace(tmp, kept)
    return raw
