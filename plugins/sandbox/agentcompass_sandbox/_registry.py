"""Pulling an image from an OCI registry without any daemon, through ``oras``.

:func:`pull_layout` fetches the image's manifest (choosing this host's
platform from an index), its config and its layers with the ORAS project's
client (``oras``, the registry HTTP API v2 with its token authentication),
and writes them as an OCI image layout that :mod:`._rootfs` unpacks. What a
registry sends is hostile input: every blob is checked against its digest
while it is written, and the whole image is bounded by
:data:`~._rootfs.MAX_BYTES`. A registry on loopback is spoken to over plain
HTTP (as Docker does); any other over HTTPS.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Any

from ._rootfs import MAX_BYTES, MAX_JSON_BYTES, ImageFormatError

_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
_LOOPBACK = ("localhost", "127.", "[::1]")


def _platform(manifests: list[Any]) -> str:
    for item in manifests:
        wanted = item.get("platform") or {} if isinstance(item, dict) else {}
        if wanted.get("os") == "linux" and wanted.get("architecture") == _ARCH:
            return str(item["digest"])
    raise ImageFormatError(f"the image has no linux/{_ARCH} manifest")


def _fetch(registry: Any, container: Any, digest: str, blobs: Path, budget: list[int]) -> None:
    """One blob into ``blobs``, checked against ``digest`` and the budget as it arrives."""
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise ImageFormatError(f"not a sha256 digest: {digest!r}")
    target = blobs / digest[7:]
    if target.exists():
        return
    part = target.with_suffix(".part")
    hasher = hashlib.sha256()
    with registry.get_blob(container, digest, stream=True) as response:
        response.raise_for_status()
        with open(part, "wb") as out:
            for chunk in response.iter_content(chunk_size=1 << 20):
                budget[0] -= len(chunk)
                if budget[0] < 0:
                    raise ImageFormatError(f"the image is larger than {MAX_BYTES} bytes")
                hasher.update(chunk)
                out.write(chunk)
    if "sha256:" + hasher.hexdigest() != digest:
        part.unlink()
        raise ImageFormatError(f"blob {digest[:19]} does not match its digest")
    part.rename(target)


def pull_layout(reference: str, directory: str) -> None:
    """Write the image ``reference`` (``host[:port]/name[:tag|@digest]``) as
    an OCI image layout in the empty ``directory`` (blocking). Raises
    :class:`ImageFormatError` for a malformed or oversized image, ``OSError``
    or the client's errors for a registry that does not serve it."""
    from oras.provider import Registry  # imported where a registry is asked, not at every open

    host = reference.split("/", 1)[0]
    registry = Registry(insecure=host.startswith(_LOOPBACK))
    container = registry.get_container(reference)
    manifest = registry.get_manifest(container)
    if isinstance(manifest, dict) and isinstance(manifest.get("manifests"), list):
        container.digest = _platform(manifest["manifests"])
        manifest = registry.get_manifest(container)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
        raise ImageFormatError(f"{reference}: the registry sent no image manifest")
    body = json.dumps(manifest).encode()
    if len(body) > MAX_JSON_BYTES:
        raise ImageFormatError(f"{reference}: the manifest is larger than {MAX_JSON_BYTES} bytes")
    blobs = Path(directory) / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    budget = [MAX_BYTES]
    digests = [(manifest.get("config") or {}).get("digest"), *(layer.get("digest") for layer in manifest["layers"])]
    for digest in digests:
        _fetch(registry, container, digest, blobs, budget)
    manifest_digest = hashlib.sha256(body).hexdigest()
    (blobs / manifest_digest).write_bytes(body)
    index = {"schemaVersion": 2, "manifests": [{"digest": f"sha256:{manifest_digest}", "size": len(body)}]}
    (Path(directory) / "index.json").write_text(json.dumps(index))
    (Path(directory) / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
