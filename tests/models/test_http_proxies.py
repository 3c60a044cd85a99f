"""The proxy table of an endpoint's client, read from the environment as httpx reads it."""

from __future__ import annotations

import pytest

from agentcompass._models._http import environment_proxies


@pytest.fixture(autouse=True)
def no_proxies_from_the_host(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def test_no_proxy_variable_is_no_mount():
    assert environment_proxies() == {}


def test_each_scheme_mounts_its_proxy_and_a_bare_host_is_http(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://10.0.0.1:3128")
    monkeypatch.setenv("HTTPS_PROXY", "proxy.example:8080")
    monkeypatch.setenv("ALL_PROXY", "socks5://10.0.0.2:1080")
    assert environment_proxies() == {
        "http://": "http://10.0.0.1:3128",
        "https://": "http://proxy.example:8080",
        "all://": "socks5://10.0.0.2:1080",
    }


def test_no_proxy_exempts_hosts_addresses_and_domains_as_curl_does(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://10.0.0.1:3128")
    monkeypatch.setenv(
        "NO_PROXY", "127.0.0.1, ::1,localhost,.internal,example.com,https://direct.example,192.168.0.0/16,"
    )
    assert environment_proxies() == {
        "http://": "http://10.0.0.1:3128",
        "all://127.0.0.1": None,
        "all://[::1]": None,
        "all://localhost": None,
        "all://*.internal": None,
        "all://*example.com": None,
        "https://direct.example": None,
        "all://192.168.0.0/16": None,
    }


def test_no_proxy_star_turns_every_proxy_off(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://10.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,*")
    assert environment_proxies() == {}
