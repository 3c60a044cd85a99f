"""``compass`` whose run stores write through a disk that stalls for good.

``python stalling_compass.py MARKER FIFO ARGS...`` runs ``compass ARGS...``
on the real filesystem until the file MARKER exists; from then on every
sync writes ``stalled`` to the test's FIFO and blocks in its store thread
for the rest of the process's life.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Iterable

from agentcompass._cli import main
from agentcompass._orchestration._launch import orchestrate
from agentcompass._store import Disk


class StallingDisk(Disk):
    def __init__(self, marker: str, fifo: str) -> None:
        super().__init__()
        self.marker = marker
        self.fifo = fifo

    def sync(self, paths: Iterable[str]) -> None:
        if os.path.exists(self.marker):
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)  # the test holds it open
            try:
                os.write(fd, b"stalled\n")
            finally:
                os.close(fd)
            threading.Event().wait()
        super().sync(paths)


if __name__ == "__main__":
    marker, fifo, *args = sys.argv[1:]
    main(args, engine=functools.partial(orchestrate, disk=StallingDisk(marker, fifo)))
