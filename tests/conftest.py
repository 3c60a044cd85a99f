"""Fixtures of ``tests/``: the Ray cluster (``executor``, ``ray_cluster``); the
autouse ones every test directory shares are in the repository's ``conftest.py``."""

from __future__ import annotations

from _ray_support import executor as executor  # noqa: F401 - one session cluster for the whole suite
from _ray_support import ray_cluster as ray_cluster  # noqa: F401
