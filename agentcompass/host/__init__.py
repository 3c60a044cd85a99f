"""Host helpers for environment-provider plugins: a file lock, read-only
binds, state directories and their markers, and the host errors.

What an environment provider does on the host, beside its sessions, is the
same few things whatever isolates the sessions (``sandbox``, ``docker`` and
``remote`` use this module, and so does the runtime's own store and agent
cache):

- **An advisory file lock** (:class:`FileLock`): an exclusive ``flock`` on a
  file (made when missing) or a directory, shared by every process of the
  host. :meth:`FileLock.open` waits without blocking Trio (the wait runs in
  a worker thread) and is cancellable: a cancelled wait never keeps the
  lock, even when the thread gets it after the caller has left.
  :meth:`FileLock.acquire` is the same wait for code that already runs in a
  worker thread; :meth:`FileLock.try_acquire` never waits. The kernel
  releases the lock when its holder dies, so a lock that can be taken
  belonged to no live process: that is how a provider tells a dead
  server's leftovers from a live one's. Non-goals: it is not reentrant
  (two holders in one process exclude each other too) and not shared
  between readers; ``flock`` does not work across NFS everywhere.
- **A read-only bind** (:func:`bind_read_only`): a host directory made
  visible under a mount that a session sees, read-only, ``nosuid`` and
  ``nodev``, in a way that survives mount propagation (see the function).
  :func:`unmount` detaches one (nothing mounted there is fine).
- **A session's state directory** (:func:`claim_state_dir`), named after
  the session so that ``close``, ``reap`` and ``sweep`` find it from the
  name alone, and its **marker** (:func:`write_marker`, :func:`read_marker`),
  a small JSON record written atomically that tells a later ``reap`` what
  the session had made.
- **The errors** (:class:`HostError`, :class:`SessionExists`)::

      RuntimeError
      └── HostError            a host command, mount or file operation failed
          └── SessionExists    the session's state directory exists already

Everything but :meth:`FileLock.open` blocks: call it in a worker thread
(``trio.to_thread.run_sync``). Mounting needs ``CAP_SYS_ADMIN``.
"""

from ..runtime._public import publish as _publish
from ._errors import HostError as HostError
from ._errors import SessionExists as SessionExists
from ._lock import FileLock as FileLock
from ._mounts import bind_read_only as bind_read_only
from ._mounts import unmount as unmount
from ._state import claim_state_dir as claim_state_dir
from ._state import read_marker as read_marker
from ._state import write_marker as write_marker

__all__ = [
    "FileLock",
    "HostError",
    "SessionExists",
    "bind_read_only",
    "claim_state_dir",
    "read_marker",
    "unmount",
    "write_marker",
]

_publish(__name__, globals())
