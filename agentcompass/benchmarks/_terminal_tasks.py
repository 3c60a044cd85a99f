"""Loading ``terminal`` task directories: the Harbor layout and the older
Terminal-Bench one, read as untrusted input.

A task loads into a :class:`TaskSpec` whose ``data`` says everything the
benchmark's phases need later (all JSON-ready):

- ``instruction``, ``dir`` (the resolved task directory), ``layout``
  (``harbor`` or ``terminal-bench``);
- ``image`` (``[environment] docker_image``) and ``build_context`` (the
  directory holding the task's ``Dockerfile`` or compose file, or None);
- ``sandbox``: the rest of ``[environment]`` as :class:`SandboxSpec` fields
  (``workdir``, ``env``, ``cpus``, ``memory_mb``, ``storage_mb``,
  ``build_timeout_seconds``);
- ``allow_internet``, ``solution_env``, ``verifier_env``;
- ``literal_paths``: whether the task's scripts name ``/app``, ``/tests``,
  ``/logs`` or ``/solution`` literally (not as ``${APP_DIR:-/app}``).

``metadata`` holds the timeouts, the ``[metadata]`` table and, under
``unknown_keys``, every ``task.toml`` key the benchmark does not know (kept,
not dropped: the benchmark lists them once per request).
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from agentcompass import ComponentError, TaskSpec
from agentcompass.runtime import read_beneath

__all__ = ["IMAGE_FILES", "link_inside", "load_task_dirs", "load_tasks"]

#: Files of a task that describe a container image rather than its contents.
IMAGE_FILES = frozenset({"Dockerfile", "docker-compose.yaml", "docker-compose.yml"})

_MAX_TASK_TEXT_BYTES = 16 * 1024 * 1024

# ``task.toml`` keys the benchmark honours, by table (SPEC 10 "Terminal tasks").
_KNOWN: dict[str, frozenset[str]] = {
    "": frozenset({"version", "metadata", "agent", "verifier", "environment", "solution"}),
    "agent": frozenset({"timeout_sec"}),
    "verifier": frozenset({"timeout_sec", "env"}),
    "solution": frozenset({"env"}),
    "environment": frozenset(
        {
            "docker_image",
            "build_timeout_sec",
            "cpus",
            "memory",
            "memory_mb",
            "storage",
            "storage_mb",
            "workdir",
            "allow_internet",
            "env",
        }
    ),
}
# Keys of the older layout's task.yaml the benchmark reads.
_TB_KNOWN = frozenset(
    {"instruction", "descriptions", "category", "difficulty", "tags", "max_agent_timeout_sec", "max_test_timeout_sec"}
)
# A literal sandbox root in a script: not the default of a ``${VAR:-/app}``.
_LITERAL_PATH = re.compile(r"(?<!:-)(?<![\w.-])/(app|tests|logs|solution)(?![\w.-])")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_MB = {"": 1.0, "b": 1 / 2**20, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}


def load_tasks(path: str | Path) -> list[TaskSpec]:
    """Every task directory under ``path``, sorted by id (blocking)."""
    root = Path(path).absolute()
    if not root.is_dir():
        raise ComponentError(f"path: task directory {str(root)!r} does not exist")
    dirs = sorted((d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")), key=lambda d: d.name)
    tasks = [_load_task(d) for d in dirs]
    if not tasks:
        raise ComponentError(f"path: no task directories in {str(root)!r}")
    return tasks


def load_task_dirs(directories: Sequence[Path]) -> list[TaskSpec]:
    """The tasks of these task directories (a dataset's), sorted by id (blocking)."""
    if not directories:
        raise ComponentError("dataset: it lists no tasks")
    return sorted((_load_task(Path(d)) for d in directories), key=lambda t: t.task_id)


def _load_task(directory: Path) -> TaskSpec:
    where = f"path: task {directory.name!r}"
    _check_links(directory, where)
    if not (directory / "instruction.md").is_file() and (directory / "task.yaml").is_file():
        return _load_terminal_bench(directory, where)
    if not (directory / "instruction.md").is_file():
        raise ComponentError(f"{where} has no instruction.md ({directory})")
    if not (directory / "tests" / "test.sh").is_file():
        raise ComponentError(f"{where} has no tests/test.sh ({directory})")
    config: dict[str, Any] = {}
    if (directory / "task.toml").is_file():
        try:
            config = tomllib.loads(_read_text(directory, "task.toml", where))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ComponentError(f"{where}: invalid task.toml: {exc}") from None
    tables = {name: _table(config, name, where) for name in ("metadata", "agent", "verifier", "solution", "environment")}
    metadata_table = tables["metadata"]
    category = metadata_table.get("category")
    if category is not None and not isinstance(category, str):
        raise ComponentError(f"{where}: [metadata] category must be a string")
    metadata: dict[str, Any] = {}
    for section in ("agent", "verifier"):
        timeout = _positive(tables[section].get("timeout_sec"), f"{where}: [{section}] timeout_sec")
        if timeout is not None:
            metadata[f"{section}_timeout_sec"] = timeout
    if metadata_table:
        metadata["metadata"] = _jsonable(metadata_table)
    unknown = _unknown_keys(config)
    if unknown:
        metadata["unknown_keys"] = unknown
    environment = tables["environment"]
    image_dir = directory / "environment"
    data = {
        "instruction": _read_text(directory, "instruction.md", where),
        "dir": str(directory.resolve()),
        "layout": "harbor",
        **_environment(environment, image_dir if _has_image_file(image_dir) else None, where),
        "solution_env": _env(tables["solution"].get("env"), f"{where}: [solution.env]"),
        "verifier_env": _env(tables["verifier"].get("env"), f"{where}: [verifier.env]"),
        "literal_paths": _names_literal_paths(directory, ("tests", "solution"), where),
    }
    return TaskSpec(task_id=directory.name, data=data, category=category, metadata=metadata)


def _load_terminal_bench(directory: Path, where: str) -> TaskSpec:
    """The older Terminal-Bench layout: ``task.yaml`` (instruction, timeouts,
    category), ``Dockerfile`` at the top, ``run-tests.sh`` and ``tests/``,
    ``solution.sh``. The verifier is ``run-tests.sh`` and passes on exit 0."""
    if not (directory / "run-tests.sh").is_file():
        raise ComponentError(f"{where} has no run-tests.sh ({directory})")
    try:
        config = yaml.load(_read_text(directory, "task.yaml", where), Loader=_NoAliasLoader) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ComponentError(f"{where}: invalid task.yaml: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ComponentError(f"{where}: invalid task.yaml: nested too deeply") from None
    if not isinstance(config, dict):
        raise ComponentError(f"{where}: task.yaml must be a mapping")
    instruction = config.get("instruction")
    if instruction is None:
        descriptions = config.get("descriptions") or []
        instruction = next((d.get("description") for d in descriptions if isinstance(d, dict)), None)
    if not isinstance(instruction, str) or not instruction.strip():
        raise ComponentError(f"{where}: task.yaml has no instruction")
    category = config.get("category")
    metadata: dict[str, Any] = {}
    for key, name in (("max_agent_timeout_sec", "agent_timeout_sec"), ("max_test_timeout_sec", "verifier_timeout_sec")):
        timeout = _positive(config.get(key), f"{where}: task.yaml {key}")
        if timeout is not None:
            metadata[name] = timeout
    kept = {k: _jsonable(v) for k, v in config.items() if k in ("difficulty", "tags")}
    if kept:
        metadata["metadata"] = kept
    unknown = {str(k): _jsonable(v) for k, v in config.items() if k not in _TB_KNOWN}
    if unknown:
        metadata["unknown_keys"] = unknown
    data = {
        "instruction": instruction,
        "dir": str(directory.resolve()),
        "layout": "terminal-bench",
        **_environment({}, directory if _has_image_file(directory) else None, where),
        "solution_env": {},
        "verifier_env": {},
        "literal_paths": True,  # its scripts and images use /app and $TEST_DIR=/tests as such
    }
    return TaskSpec(
        task_id=directory.name, data=data, category=category if isinstance(category, str) else None, metadata=metadata
    )


class _NoAliasLoader(yaml.SafeLoader):
    """A task.yaml is untrusted and needs no anchors: an alias is refused
    rather than expanded (no "billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError(f"aliases are not allowed in task.yaml{self.peek_event().start_mark}")
        return super().compose_node(parent, index)


def _environment(table: dict[str, Any], build_context: Path | None, where: str) -> dict[str, Any]:
    where = f"{where}: [environment]"
    image = table.get("docker_image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise ComponentError(f"{where} docker_image must be a non-empty string")
    allow_internet = table.get("allow_internet", True)
    if not isinstance(allow_internet, bool):
        raise ComponentError(f"{where} allow_internet must be true or false")
    workdir = table.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise ComponentError(f"{where} workdir must be an absolute path")
    cpus = _positive(table.get("cpus"), f"{where} cpus")
    sandbox = {
        "workdir": workdir,
        "env": _env(table.get("env"), f"{where}.env"),
        "cpus": cpus,
        "memory_mb": _megabytes(table, "memory", where),
        "storage_mb": _megabytes(table, "storage", where),
        "build_timeout_seconds": _positive(table.get("build_timeout_sec"), f"{where} build_timeout_sec"),
    }
    return {
        "image": image,
        "build_context": str(build_context.resolve()) if build_context is not None else None,
        "sandbox": {k: v for k, v in sandbox.items() if v not in (None, {})},
        "allow_internet": allow_internet,
    }


def _has_image_file(directory: Path) -> bool:
    return any((directory / name).is_file() for name in IMAGE_FILES)


def _megabytes(table: dict[str, Any], key: str, where: str) -> int | None:
    """``memory_mb`` / ``storage_mb`` (MiB), or ``memory`` / ``storage`` as
    ``"2G"``, ``"512M"``, ``"1Gi"`` or a number of MiB."""
    value = table.get(f"{key}_mb", table.get(key))
    if value is None:
        return None
    if isinstance(value, bool):
        raise ComponentError(f"{where} {key} must be a size like '2G' or a number of MiB, got {value!r}")
    if isinstance(value, (int, float)):
        megabytes = float(value)
    else:
        match = _SIZE.match(str(value))
        if match is None:
            raise ComponentError(f"{where} {key} must be a size like '2G' or a number of MiB, got {value!r}")
        unit = (match.group(2) or "").lower()[:1]
        megabytes = float(match.group(1)) * _SIZE_MB[unit]
    if not megabytes > 0:
        raise ComponentError(f"{where} {key} must be positive, got {value!r}")
    return max(1, round(megabytes))


def _env(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ComponentError(f"{where} must be a table of strings")
    env = {}
    for name, item in value.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ComponentError(f"{where}: {name!r} is not a variable name")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ComponentError(f"{where}: {name} must be a string")
        env[name] = str(item)
    return env


def _table(config: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise ComponentError(f"{where}: [{name}] in task.toml must be a table")
    return value


def _unknown_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``task.toml`` keys the benchmark does not read, dotted (``environment.gpus``)."""
    unknown: dict[str, Any] = {}
    for key, value in config.items():
        if key not in _KNOWN[""]:
            unknown[key] = _jsonable(value)
        elif key in _KNOWN and isinstance(value, dict):
            for sub, item in value.items():
                if sub not in _KNOWN[key]:
                    unknown[f"{key}.{sub}"] = _jsonable(item)
    return unknown


def _names_literal_paths(directory: Path, subs: tuple[str, ...], where: str) -> bool:
    """Whether a shell script under ``subs`` names a sandbox root literally."""
    for sub in subs:
        top = directory / sub
        if not top.is_dir():
            continue
        for script in sorted(top.rglob("*.sh")):
            if script.is_symlink() or not script.is_file():
                continue
            text = _read_text(directory, script.relative_to(directory).as_posix(), where)
            if _LITERAL_PATH.search(text):
                return True
    return False


def _positive(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ComponentError(f"{where} must be a positive number, got {value!r}")
    return float(value)


def _check_links(directory: Path, where: str) -> None:
    """Refuse a task directory holding a symbolic link that resolves outside it
    (absolute or relative, dangling or not), or whose ``environment``,
    ``tests`` or ``solution`` is a link: a task directory is untrusted input,
    and its files are read by the runtime's user."""
    task_real = os.path.realpath(directory)
    for sub in ("environment", "tests", "solution"):
        if (directory / sub).is_symlink():
            raise ComponentError(f"{where}: {sub} is a symbolic link, not a directory")
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(task_real, follow_symlinks=False):
        for name in sorted([*dirnames, *filenames]):
            if not stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                continue
            target = os.readlink(name, dir_fd=dir_fd)
            if link_inside(task_real, os.path.join(dirpath, name), target) is None:
                rel = Path(dirpath, name).relative_to(task_real).as_posix()
                raise ComponentError(f"{where}: symbolic link {rel!r} points outside the task directory ({target!r})")


def link_inside(task_real: str, link: str, target: str) -> str | None:
    """The target to give the link ``link`` (whose text is ``target``) in a
    session, or None when it resolves (as the kernel would, through links
    before it) outside the task directory ``task_real``. An absolute target
    inside is made relative, since the task directory's host path means
    nothing in a session."""
    resolved = os.path.realpath(link)
    if os.path.commonpath([task_real, resolved]) != task_real:
        return None
    if os.path.isabs(target):
        return os.path.relpath(resolved, os.path.realpath(os.path.dirname(link)))
    return target


def _read_text(directory: Path, name: str, where: str) -> str:
    """A file of a task directory as text, read as a regular file of at most
    16 MiB, without blocking on a FIFO or leaving the task directory."""
    # A link inside the task directory is followed by hand: the path it
    # resolves to is read by a walk that refuses any link still on the way.
    task_real = os.path.realpath(directory)
    resolved = os.path.realpath(directory / name)
    try:
        return read_beneath(task_real, os.path.relpath(resolved, task_real), _MAX_TASK_TEXT_BYTES).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ComponentError(f"{where}: cannot read {name}: {exc}") from None


def _jsonable(value: Any) -> Any:
    """TOML and YAML values as JSON-ready data (dates and times become ISO strings)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
