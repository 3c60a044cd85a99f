"""The results viewer (SPEC 10, ``compass view``): read-only pages over run
directories, served on loopback or written as static files.

Private package: the CLI is its only user-facing entry point.
"""

from ._data import CHUNK_STEPS as CHUNK_STEPS
from ._data import ROW_BUDGET_SECONDS as ROW_BUDGET_SECONDS
from ._data import find_runs as find_runs
from ._server import serve as serve
from ._site import Site as Site
from ._site import write_site as write_site
