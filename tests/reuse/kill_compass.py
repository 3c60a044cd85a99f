"""``compass`` with every run store on :class:`reuse_plugins.KillPointDisk`.

``python kill_compass.py ARGS...`` runs ``compass ARGS...``. This directory
is the script's, first on ``sys.path``: a config naming ``reuse_plugins`` in
``plugins:`` gets the module imported here.
"""

from __future__ import annotations

import functools
import sys

from reuse_plugins import KillPointDisk

from agentcompass._cli import main
from agentcompass._orchestration._launch import orchestrate

if __name__ == "__main__":
    main(sys.argv[1:], engine=functools.partial(orchestrate, disk=KillPointDisk()))
