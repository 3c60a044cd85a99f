"""Forwarding beside Docker's firewall: accept rules in ``DOCKER-USER`` for a
sandbox's veth, and their removal.

A Docker daemon with its default firewall handling sets the ``FORWARD``
chain's policy to ``DROP`` (in iptables' ``filter`` table, nftables' ``ip
filter`` under iptables-nft). The sandbox's own host table accepts a
sandbox's forwarded packets, but in nftables a drop at the same hook in
another table wins, so without more a sandbox under ``full`` or
``allowlist`` has no egress (its DNS queries included) on a host that runs
Docker. Docker documents the chain ``DOCKER-USER`` (jumped to first from
``FORWARD``, never flushed by the daemon) for rules of the host's own: where
it exists, each veth that needs egress gets two rules there, inserted with
the same ``iptables`` tool Docker uses (so legacy and nft back ends alike),
marked with a comment naming the veth's owner::

    -i <veth> -j ACCEPT                                   (the sandbox's packets out)
    -o <veth> -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT   (replies to them)

Nothing else is accepted: Docker's rules for its own networks, and any
other traffic's fate, are unchanged. Whether the chain may exist is asked
of the kernel first (one netlink request, no process), so a host without
Docker pays for no ``iptables`` run. Where ``DOCKER-USER`` does not exist
nothing is added (a ``FORWARD`` policy of ``DROP`` set by the host's own
firewall is its administrator's to open). The rules go when the veth goes:
:func:`remove` at close (a session's own veth) or when the pool destroys a
namespace, and :func:`owners` lets ``sweep`` and the pool's stale-lease
reclaim find those a killed runtime left. A Docker daemon started after a
veth was made does not see it admitted: the next namespace made is.
"""

from __future__ import annotations

import shutil
import socket
import subprocess

from . import _netlink

CHAIN = "DOCKER-USER"
#: The comment of every rule added here: this prefix, then the owner's name.
MARK = "agentcompass-sandbox:"


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)


def _rules(veth: str, owner: str) -> list[list[str]]:
    comment = ["-m", "comment", "--comment", f"{MARK}{owner}"]
    return [
        ["-i", veth, *comment, "-j", "ACCEPT"],
        ["-o", veth, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", *comment, "-j", "ACCEPT"],
    ]


def _chain_rules() -> list[str] | None:
    """``iptables -S DOCKER-USER``'s lines, ``None`` where there is no such chain (or no iptables)."""
    if shutil.which("iptables") is None or not _may_exist():
        return None
    listed = _iptables("-S", CHAIN)
    return listed.stdout.splitlines() if listed.returncode == 0 else None


def _may_exist() -> bool:
    """Whether the chain may exist, known without a process: the nftables
    ``ip filter`` table has it (iptables-nft), or a legacy ``filter`` table
    is there (which only ``iptables`` can look into)."""
    try:
        with open("/proc/net/ip_tables_names") as names:
            if "filter" in names.read().split():
                return True
    except OSError:
        pass
    try:
        return _netlink.nft_chain_exists(socket.AF_INET, "filter", CHAIN)
    except OSError:
        return True  # cannot tell: ask iptables


def admit(veth: str, owner: str) -> bool:
    """Blocking: let ``veth``'s traffic through ``DOCKER-USER`` where that chain
    exists (idempotent); whether rules are in place. Raises ``OSError`` with
    iptables' message if an insert fails (nothing of this veth is left then)."""
    if _chain_rules() is None:
        return False
    for rule in _rules(veth, owner):
        if _iptables("-C", CHAIN, *rule).returncode == 0:
            continue
        inserted = _iptables("-I", CHAIN, *rule)
        if inserted.returncode != 0:
            remove(veth, owner)
            raise OSError(f"iptables -I {CHAIN} failed: {' '.join(inserted.stderr.split())[:300]}")
    return True


def remove(veth: str, owner: str) -> None:
    """Blocking: delete ``veth``'s rules (absent ones, or no chain, are fine)."""
    listed = _chain_rules()
    if not listed or not any(f"{MARK}{owner}" in line for line in listed):
        return
    for rule in _rules(veth, owner):
        # -D removes one copy: repeat while one is there (bounded, a copy per earlier insert at most).
        for _ in range(16):
            if _iptables("-D", CHAIN, *rule).returncode != 0:
                break


def owners() -> dict[str, set[str]]:
    """Blocking: owner name -> the veths it has rules for in ``DOCKER-USER``."""
    found: dict[str, set[str]] = {}
    for line in _chain_rules() or []:
        words = line.split()
        if "--comment" not in words or "-j" not in words:
            continue
        comment = words[words.index("--comment") + 1].strip('"')
        if not comment.startswith(MARK):
            continue
        for flag in ("-i", "-o"):
            if flag in words:
                found.setdefault(comment[len(MARK) :], set()).add(words[words.index(flag) + 1])
    return found


def remove_owned_by(owner: str) -> None:
    """Blocking: delete every rule whose comment names ``owner``."""
    for veth in owners().get(owner, ()):
        remove(veth, owner)
