"""Reading a file out of the daemon's archive stream, header first, bounded.

``GET /containers/{id}/archive`` answers with a tar of the path, whose
header says what it is and how long; only a regular file within the limit
has its bytes read, so a link, a FIFO or a huge sparse file costs one
header, never a wait or the memory of its size.
"""

from __future__ import annotations

import tarfile
from typing import Any

import httpx

from agentcompass import FileRefusedError


async def first_member(response: httpx.Response, path: str, limit: int) -> bytes:
    """The content of the archive's first member if it is a regular file
    within ``limit`` bytes; refuse anything else after reading only its header."""
    reader = _Reader(response.aiter_raw())
    pax: dict[str, str] = {}
    while True:
        block = await reader.read(tarfile.BLOCKSIZE)
        if len(block) < tarfile.BLOCKSIZE or block == bytes(tarfile.BLOCKSIZE):
            raise FileNotFoundError(f"{path}: the daemon sent no file")
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.TarError as exc:
            raise OSError(f"{path}: unreadable archive from the daemon: {exc}") from None
        if info.type in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            if info.size > 1 << 20:
                raise OSError(f"{path}: oversized archive header from the daemon")
            extra = await reader.read(_padded(info.size))
            if info.type == tarfile.XHDTYPE:
                pax.update(_pax(extra[: info.size]))
            continue
        break
    size = int(pax["size"]) if "size" in pax else info.size
    if info.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        raise FileRefusedError(f"{path}: a link, not followed")
    if info.type == tarfile.DIRTYPE:
        raise IsADirectoryError(f"{path}: is a directory")
    if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise FileRefusedError(f"{path}: not a regular file")
    if size > limit:
        raise FileRefusedError(f"{path}: {size} bytes, more than the {limit} allowed")
    data = await reader.read(size)
    if len(data) != size:
        raise OSError(f"{path}: the daemon's archive ended early")
    return data


def _padded(size: int) -> int:
    return (size + tarfile.BLOCKSIZE - 1) // tarfile.BLOCKSIZE * tarfile.BLOCKSIZE


def _pax(raw: bytes) -> dict[str, str]:
    out = {}
    for line in raw.split(b"\n"):
        _, _, record = line.partition(b" ")
        key, sep, value = record.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


class _Reader:
    """Exact-size reads over an async byte iterator, buffering at most one chunk beyond."""

    def __init__(self, chunks: Any):
        self._chunks = chunks
        self._buffer = bytearray()
        self._done = False

    async def read(self, size: int) -> bytes:
        while len(self._buffer) < size and not self._done:
            try:
                self._buffer += await self._chunks.__anext__()
            except StopAsyncIteration:
                self._done = True
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data
