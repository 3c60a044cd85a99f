"""The test browser's WebDriver client against a fake driver (httpx's mock
transport at the client seam): an element the page replaced between its find
and its use is found again."""

from __future__ import annotations

import json

import httpx
import pytest

from agentcompass._view._browser import _ELEMENT, Browser, StaleElementError


class FakeDriver:
    """Each find returns a new element; commands on the first ``stale``
    elements fail as a re-render would make them."""

    def __init__(self, stale: int) -> None:
        self.stale, self.found, self.calls = stale, 0, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/session/s")
        self.calls.append(f"{request.method} {path}")
        if path == "/element":
            self.found += 1
            return httpx.Response(200, json={"value": {_ELEMENT: f"e{self.found}"}})
        element = int(path.split("/")[2][1:])
        if element <= self.stale:
            return httpx.Response(404, json={"value": {"error": "stale element reference", "message": "stale element not found"}})
        command = path.split("/")[3]
        value = f"text of e{element}" if command == "text" else None
        if command == "value":
            assert json.loads(request.content) == {"text": "abc"}
        return httpx.Response(200, json={"value": value})


async def test_a_replaced_element_is_found_again() -> None:
    driver = FakeDriver(stale=2)
    async with httpx.AsyncClient(transport=httpx.MockTransport(driver), base_url="http://driver") as client:
        browser = Browser(client, "s")
        assert await browser.text("#x") == "text of e3"
        await browser.click("#x")
        await browser.type("#x", "abc")
    assert driver.calls == ["POST /element", "GET /element/e1/text", "POST /element", "GET /element/e2/text",
                            "POST /element", "GET /element/e3/text", "POST /element", "POST /element/e4/click", "POST /element",
                            "POST /element/e5/value"]  # fmt: skip


async def test_an_element_replaced_every_time_is_an_error() -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(FakeDriver(stale=99)), base_url="http://driver") as client:
        with pytest.raises(StaleElementError, match="stale element reference"):
            await Browser(client, "s").text("#x")
