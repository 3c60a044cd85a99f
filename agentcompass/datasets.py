"""Datasets by name (SPEC 12 "Datasets"; ``docs/datasets.md``).

A dataset is a named, versioned list of task directories, each pinned to a
git commit, listed in a registry in Harbor's ``registry.json`` format. The
``terminal`` benchmark runs one by ``dataset: NAME@VERSION`` (or a git
directory by ``path: git+URL@REF#SUBDIR``); ``compass datasets list`` and
``compass datasets pull`` read and fetch them. Fetching blocks (it runs
``git``): inside a Trio run call it through ``trio.to_thread.run_sync``.
"""

from ._datasets._git import CACHE_VARIABLE as CACHE_VARIABLE
from ._datasets._git import GitPath as GitPath
from ._datasets._git import cache_root as cache_root
from ._datasets._git import fetch_task as fetch_task
from ._datasets._git import resolve_ref as resolve_ref
from ._datasets._known import KNOWN_BENCHMARKS as KNOWN_BENCHMARKS
from ._datasets._known import KnownBenchmark as KnownBenchmark
from ._datasets._known import known_benchmark as known_benchmark
from ._datasets._pull import PulledDataset as PulledDataset
from ._datasets._pull import declared as declared
from ._datasets._pull import pull_dataset as pull_dataset
from ._datasets._pull import pull_git_path as pull_git_path
from ._datasets._registry_file import DEFAULT_REGISTRY as DEFAULT_REGISTRY
from ._datasets._registry_file import REGISTRY_VARIABLE as REGISTRY_VARIABLE
from ._datasets._registry_file import Dataset as Dataset
from ._datasets._registry_file import DatasetTask as DatasetTask
from ._datasets._registry_file import find_dataset as find_dataset
from ._datasets._registry_file import read_registry as read_registry
from ._datasets._registry_file import registry_source as registry_source
from ._datasets._registry_file import split_spec as split_spec
from .runtime._public import publish as _publish

_publish(__name__, globals())
