"""Helpers of the ``docker`` tests: providers on the session's private daemon."""

from __future__ import annotations

from typing import Any

import httpx
from agentcompass_docker import DockerEnvironment
from agentcompass_docker.base import BASE_IMAGE
from agentcompass_docker.testing import PrivateDaemon


def provider(daemon: PrivateDaemon, **config: Any) -> DockerEnvironment:
    """A provider on ``daemon`` whose tasks run the base image unless they name one."""
    return DockerEnvironment({"host": daemon.host, "default_image": BASE_IMAGE, "pull": "never", **config})


def labelled(daemon: PrivateDaemon, prefix: str = "") -> list[str]:
    """Containers and networks labelled by the provider, whose session name starts with ``prefix``."""
    filters = '{"label": ["agentcompass.session"]}'
    transport = httpx.HTTPTransport(uds=daemon.host[len("unix://") :])
    with httpx.Client(transport=transport, base_url="http://docker/v1.41") as client:
        found = client.get("/containers/json", params={"all": "1", "filters": filters}).json()
        found += client.get("/networks", params={"filters": filters}).json()
    return [
        item["Labels"]["agentcompass.session"]
        for item in found
        if item["Labels"]["agentcompass.session"].startswith(prefix)
    ]
