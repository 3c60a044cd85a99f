"""The ``docker`` tests: the private daemon is the ``docker_daemon`` fixture of
:mod:`agentcompass_docker.testing` (a pytest plugin the distribution
registers); the repository's ``tests/`` helpers (``_common``) are importable
here too, whichever test directories a run collects."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[3] / "tests"
if str(_TESTS) not in sys.path:
    sys.path.append(str(_TESTS))
