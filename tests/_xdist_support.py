"""How the suite shares real resources when ``make test`` runs it on several
pytest-xdist workers (``-n 2 --dist loadgroup``); without xdist nothing here
changes a run.

Session resources (the Ray test cluster, the private dockerd with its base
image): a session-scoped fixture of the repository lives once per worker
process, so every test that needs one is put in one ``xdist_group`` and runs
on one worker: one cluster and one daemon per run, as in a serial run. The
``executor`` fixture's Ray case asks for ``ray_cluster`` at run time, so it is
grouped by its parameter. Tests that share a module-scoped fixture stay on one
worker the same way. Groups whose tests share a resource are merged.

xdist's own ``loadgroup`` tells the controller a test's group by a suffix of
its node id, which pytest 9.2's node ids no longer take: :class:`GroupScheduling`
reads the groups from a file the workers write beside the run's temporary
directories instead (same scheduling otherwise: a group is one unit of work,
the largest units are handed out first).

The whole machine: a test marked ``serial`` (it counts what every test
makes, or its timing bound assumes the machine is its own) runs while no
other test runs on any worker. Every test holds a shared ``flock`` on a file
in the run's shared directory while it runs, a ``serial`` one holds
it exclusively; a second lock held by a waiting ``serial`` test keeps new
tests from starting until it has run (it is not starved).
"""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Session fixtures that stand for the same resource under another name.
SESSION_ALIASES = {"executor[ray]": "ray_cluster"}


def _ours(fixturedef: pytest.FixtureDef) -> bool:
    """A fixture of this repository (not pytest's own ``tmp_path_factory``, say)."""
    try:
        path = Path(inspect.getsourcefile(fixturedef.func) or "").resolve()
    except TypeError:
        return False
    return path.is_relative_to(REPO) and "site-packages" not in path.parts


def _shared_keys(item: pytest.Item) -> set[str]:
    """What ``item`` shares with other tests: session resources by name, module fixtures by module."""
    keys: set[str] = set()
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in info.name2fixturedefs.items() if info is not None else ():
        fixturedef = defs[-1]
        if not _ours(fixturedef) or fixturedef.scope == "function":
            continue
        keys.add(name if fixturedef.scope == "session" else item.nodeid.split("::")[0])
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("executor") == "ray":
        keys.add(SESSION_ALIASES["executor[ray]"])
    return keys


def group_shared(items: list[pytest.Item]) -> None:
    """Mark every test with ``xdist_group`` by the resources it shares (see the module docstring)."""
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    keyed = [(item, sorted(_shared_keys(item))) for item in items]
    for _, keys in keyed:
        for key in keys[1:]:
            parent[find(key)] = find(keys[0])
    for item, keys in keyed:
        if keys:
            item.add_marker(pytest.mark.xdist_group(find(keys[0]).replace("/", "-")))


class MachineLock:
    """The shared/exclusive lock of the module docstring, for one worker process."""

    def __init__(self, directory: Path) -> None:
        self._main = os.open(directory / "machine.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._turnstile = os.open(directory / "machine.turnstile", os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            if exclusive:
                fcntl.flock(self._main, fcntl.LOCK_EX)
        finally:
            if not exclusive:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        try:
            if not exclusive:
                fcntl.flock(self._main, fcntl.LOCK_SH)
            yield
        finally:
            fcntl.flock(self._main, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)


#: Where a worker finds the run's shared directory (``workerinput``).
RUN_DIR = "compass_xdist_dir"
_RUN_DIR = pytest.StashKey[Path]()


def run_dir(config: pytest.Config) -> Path:
    """The controller's directory shared by every worker of this run (made on first use)."""
    if _RUN_DIR not in config.stash:
        config.stash[_RUN_DIR] = Path(tempfile.mkdtemp(prefix="compass-xdist-"))
    return config.stash[_RUN_DIR]


def remove_run_dir(config: pytest.Config) -> None:
    if _RUN_DIR in config.stash:
        shutil.rmtree(config.stash[_RUN_DIR], ignore_errors=True)


def write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: tell the controller each grouped test's group."""
    directory = Path(config.workerinput[RUN_DIR])  # type: ignore[attr-defined]
    groups = {}
    for item in items:
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
        )
        if names:
            groups[item.nodeid] = "_".join(names)
    part = directory / f"groups-{config.workerinput['workerid']}.json"  # type: ignore[attr-defined]
    part.write_text(json.dumps(groups))
    os.replace(part, directory / "groups.json")


def machine_lock(config: pytest.Config) -> MachineLock | None:
    """The lock of this xdist run (None outside xdist: one process runs one test at a time)."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else MachineLock(Path(workerinput[RUN_DIR]))


try:
    from xdist.scheduler import LoadGroupScheduling
except ImportError:  # without xdist the suite runs serially
    GroupScheduling = None
else:

    class GroupScheduling(LoadGroupScheduling):  # type: ignore[no-redef]
        """``loadgroup`` with the groups the workers wrote (see the module docstring)."""

        def __init__(self, config: pytest.Config, log: object = None) -> None:
            super().__init__(config, log)  # type: ignore[arg-type]
            self._groups_file = run_dir(config) / "groups.json"
            self._groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = json.loads(self._groups_file.read_text())
            group = self._groups.get(nodeid)
            return f"group:{group}" if group is not None else super()._split_scope(nodeid)
