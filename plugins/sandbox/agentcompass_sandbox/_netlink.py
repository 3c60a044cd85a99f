"""A sandbox's veth over rtnetlink (standard-library sockets), without running ``ip``.

The host end is configured through a netlink socket of the runtime's own
network namespace; the sandbox end through a socket made in the sandbox's
namespace by a short-lived thread that enters it (``setns`` changes only
the calling thread's network namespace, and the thread ends right after,
so no other work ever runs there). Everything here blocks.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import threading
from collections.abc import Iterator

_CLONE_NEWNET = 0x40000000
_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_CTNETLINK = 1
_NFNL_SUBSYS_NFTABLES = 10
_IPCTNL_MSG_CT_DELETE = 2
_NFT_MSG_GETTABLE = 1
_NFT_MSG_GETCHAIN = 4
_NFTA_CHAIN_TABLE = 1
_NFTA_CHAIN_NAME = 3

_NLM_F_REQUEST = 0x1
_NLM_F_ACK = 0x4
_NLM_F_EXCL = 0x200
_NLM_F_CREATE = 0x400
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_RTM_NEWLINK = 16
_RTM_DELLINK = 17
_RTM_GETLINK = 18
_RTM_NEWADDR = 20
_RTM_NEWROUTE = 24

_IFLA_IFNAME = 3
_IFLA_LINKINFO = 18
_IFLA_NET_NS_FD = 28
_IFLA_INFO_KIND = 1
_IFLA_INFO_DATA = 2
_VETH_INFO_PEER = 1
_IFA_ADDRESS = 1
_IFA_LOCAL = 2
_RTA_OIF = 4
_RTA_GATEWAY = 5

_IFF_UP = 0x1
_RT_TABLE_MAIN = 254
_RTPROT_BOOT = 3
_RT_SCOPE_UNIVERSE = 0
_RTN_UNICAST = 1


class NetlinkError(OSError):
    """The kernel refused a request (``errno`` is its error)."""


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _ifinfo(index: int = 0, up: bool = False) -> bytes:
    # struct ifinfomsg: family, pad, type, index, flags, change
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, _IFF_UP if up else 0, _IFF_UP if up else 0)


def _name(name: str) -> bytes:
    return _attr(_IFLA_IFNAME, name.encode() + b"\0")


class _Socket:
    """One netlink socket (rtnetlink unless told); every request waits for its acknowledgement."""

    def __init__(self, protocol: int = socket.NETLINK_ROUTE) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def _replies(self, kind: int, flags: int, body: bytes) -> Iterator[tuple[int, bytes, int]]:
        """Send one message; yield (type, data, offset of its payload) of every reply to it."""
        self._seq += 1
        self._sock.send(struct.pack("=IHHII", 16 + len(body), kind, flags | _NLM_F_REQUEST, self._seq, 0) + body)
        while True:
            data = self._sock.recv(65536)
            offset = 0
            while offset + 16 <= len(data):
                length, msg_type, _flags, seq, _pid = struct.unpack_from("=IHHII", data, offset)
                if seq == self._seq:
                    yield msg_type, data, offset + 16
                offset += max(16, (length + 3) & ~3)

    def request(self, kind: int, flags: int, body: bytes, what: str) -> None:
        for msg_type, data, at in self._replies(kind, flags | _NLM_F_ACK, body):
            if msg_type == _NLMSG_ERROR:
                _raise_error(data, at, what, zero_ok=True)
                return

    def dump(self, kind: int, body: bytes, what: str) -> int:
        """Send a dump request; return how many records came before its end."""
        records = 0
        for msg_type, data, at in self._replies(kind, _NLM_F_DUMP, body):
            if msg_type == _NLMSG_DONE:
                break
            if msg_type == _NLMSG_ERROR:
                _raise_error(data, at, what)
            records += 1
        return records

    def index_of(self, name: str) -> int:
        """The index of interface ``name`` in this socket's namespace (the
        calling thread may be elsewhere: ``if_nametoindex`` asks the thread's own)."""
        for msg_type, data, at in self._replies(_RTM_GETLINK, 0, _ifinfo() + _name(name)):
            if msg_type == _NLMSG_ERROR:
                _raise_error(data, at, f"index of {name}")
            (index,) = struct.unpack_from("=i", data, at + 4)
            return int(index)
        raise NetlinkError(errno.EIO, f"index of {name}: no reply")


def _raise_error(data: bytes, at: int, what: str, zero_ok: bool = False) -> None:
    """Raise the error an NLMSG_ERROR payload carries (0 is an acknowledgement)."""
    (error,) = struct.unpack_from("=i", data, at)
    if error or not zero_ok:
        raise NetlinkError(-error, f"{what}: {os.strerror(-error)}")


def _add_veth(sock: _Socket, host: str, host_ip: str, peer_namespace: bytes) -> None:
    """The veth ``host`` (up, ``host_ip``/30) in the namespace of ``sock``; its
    peer ``eth0`` in the namespace ``peer_namespace`` (an IFLA_NET_NS_* attribute) names."""
    peer = _ifinfo() + _name("eth0") + peer_namespace
    info = _attr(_IFLA_INFO_KIND, b"veth") + _attr(_IFLA_INFO_DATA, _attr(_VETH_INFO_PEER, peer))
    body = _ifinfo(up=True) + _name(host) + _attr(_IFLA_LINKINFO, info)
    sock.request(_RTM_NEWLINK, _NLM_F_CREATE | _NLM_F_EXCL, body, f"veth {host}")
    _add_address(sock, sock.index_of(host), host_ip, 30)


def _add_address(sock: _Socket, index: int, address: str, prefix: int) -> None:
    packed = socket.inet_aton(address)
    # struct ifaddrmsg: family, prefixlen, flags, scope, index
    body = struct.pack("=BBBBI", socket.AF_INET, prefix, 0, _RT_SCOPE_UNIVERSE, index)
    body += _attr(_IFA_LOCAL, packed) + _attr(_IFA_ADDRESS, packed)
    sock.request(_RTM_NEWADDR, _NLM_F_CREATE | _NLM_F_EXCL, body, f"address {address}/{prefix}")


def make_veth(host: str, netns_fd: int, host_ip: str, sandbox_ip: str) -> None:
    """A veth pair, both ends up: ``host`` here with ``host_ip``/30, ``eth0``
    in the network namespace ``netns_fd`` holds with ``sandbox_ip``/30 and a
    default route via ``host_ip``. Raises :class:`OSError`."""
    sock = _Socket()
    try:
        # The peer cannot be brought up in the same request (its other end
        # does not exist yet when the kernel configures it): done inside.
        _add_veth(sock, host, host_ip, _attr(_IFLA_NET_NS_FD, struct.pack("=I", netns_fd)))
    finally:
        sock.close()
    in_namespace_fd(netns_fd, lambda: _configure_inside(sandbox_ip, host_ip))


def _configure_inside(sandbox_ip: str, gateway: str) -> None:
    sock = _Socket()
    try:
        index = socket.if_nametoindex("eth0")
        sock.request(_RTM_NEWLINK, 0, _ifinfo(index, up=True), "eth0 up")
        _add_address(sock, index, sandbox_ip, 30)
        # struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
        body = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, _RT_TABLE_MAIN, _RTPROT_BOOT, 0, _RTN_UNICAST, 0)
        body += _attr(_RTA_GATEWAY, socket.inet_aton(gateway)) + _attr(_RTA_OIF, struct.pack("=I", index))
        sock.request(_RTM_NEWROUTE, _NLM_F_CREATE | _NLM_F_EXCL, body, f"default route via {gateway}")
    finally:
        sock.close()


class Probe:
    """Descriptors opened inside a network namespace, which look at it from
    any thread: netlink sockets (bound to the namespace they are made in) and
    ``/proc/net`` files (each bound to the namespace it was opened in, read
    afresh from offset 0). They keep the namespace alive until :meth:`close`."""

    _FILES = ("sockstat", "sockstat6", "unix", "packet")

    def __init__(self) -> None:
        """In a thread inside the namespace."""
        self.route = _Socket()
        self.netfilter: _Socket | None = None
        self.files: dict[str, int] = {}
        try:
            self.netfilter = _Socket(_NETLINK_NETFILTER)
            for name in self._FILES:
                try:
                    self.files[name] = os.open(f"/proc/thread-self/net/{name}", os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # no IPv6, or no packet sockets
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.route.close()
        if self.netfilter is not None:
            self.netfilter.close()
        for fd in self.files.values():
            os.close(fd)
        self.files = {}

    def read(self, name: str) -> bytes:
        """The start of ``/proc/net/<name>`` of the namespace, as it is now ('' if absent)."""
        fd = self.files.get(name)
        return b"" if fd is None else os.pread(fd, 65536, 0)

    def links(self) -> int:
        """How many network interfaces the namespace has."""
        return self.route.dump(_RTM_GETLINK, _ifinfo(), "links")

    def nft_tables(self) -> int:
        """How many nftables tables the namespace has."""
        assert self.netfilter is not None
        # struct nfgenmsg: family (NFPROTO_UNSPEC: every family), version, resource id
        kind = _NFNL_SUBSYS_NFTABLES << 8 | _NFT_MSG_GETTABLE
        return self.netfilter.dump(kind, struct.pack("=BBH", 0, 0, 0), "nft tables")

    def flush_conntrack(self) -> None:
        """Forget every connection-tracking entry of the namespace (nothing
        to do where conntrack is not loaded)."""
        assert self.netfilter is not None
        kind = _NFNL_SUBSYS_CTNETLINK << 8 | _IPCTNL_MSG_CT_DELETE
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                self.netfilter.request(kind, 0, struct.pack("=BBH", family, 0, 0), "flush conntrack")
            except NetlinkError as exc:
                if exc.errno not in (errno.ENOENT, errno.EOPNOTSUPP, errno.EPROTONOSUPPORT):
                    raise


def make_namespace(host: str | None = None, host_ip: str = "", sandbox_ip: str = "") -> tuple[int, Probe]:
    """A new network namespace with loopback up, and with ``host`` a veth to
    this one as :func:`make_veth` makes; return a descriptor that holds the
    namespace (close-on-exec) and a :class:`Probe` of it. The namespace is
    made by a short-lived thread, which configures its inside through a
    socket it opens there. Raises :class:`OSError`."""
    made: list[int] = []
    probes: list[Probe] = []

    def inside() -> None:
        host_sock = _Socket()  # opened before the thread leaves this namespace
        try:
            if _libc.unshare(_CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"unshare a network namespace: {os.strerror(err)}")
            made.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
            if host is not None:
                _add_veth(host_sock, host, host_ip, _attr(_IFLA_NET_NS_FD, struct.pack("=I", made[0])))
        finally:
            host_sock.close()
        sock = _Socket()
        try:
            sock.request(_RTM_NEWLINK, 0, _ifinfo(socket.if_nametoindex("lo"), up=True), "lo up")
        finally:
            sock.close()
        # No TIME_WAIT: a connection closed by the sandbox leaves no socket
        # behind, so the namespace can be reused as soon as its processes are gone.
        with open("/proc/sys/net/ipv4/tcp_max_tw_buckets", "w") as f:
            f.write("0")
        if host is not None:
            _configure_inside(sandbox_ip, host_ip)
        probes.append(Probe())

    try:
        _in_thread(inside)
    except BaseException:
        if made:
            os.close(made[0])
        raise
    return made[0], probes[0]


def move_link(netns_fd: int, name: str, target_fd: int) -> None:
    """Move interface ``name`` of the namespace ``netns_fd`` into the one
    ``target_fd`` holds (it arrives down, without addresses or routes)."""

    def inside() -> None:
        sock = _Socket()
        try:
            index = sock.index_of(name)
            body = _ifinfo(index) + _attr(_IFLA_NET_NS_FD, struct.pack("=I", target_fd))
            sock.request(_RTM_NEWLINK, 0, body, f"move {name}")
        finally:
            sock.close()

    in_namespace_fd(netns_fd, inside)


def configure_inside(netns_fd: int, sandbox_ip: str, gateway: str) -> None:
    """Bring ``eth0`` of the namespace ``netns_fd`` up with ``sandbox_ip``/30
    and a default route via ``gateway`` (as :func:`make_veth` leaves it)."""
    in_namespace_fd(netns_fd, lambda: _configure_inside(sandbox_ip, gateway))


def delete_link(name: str) -> None:
    """Delete the interface ``name`` of this namespace (both ends of a veth go)."""
    sock = _Socket()
    try:
        sock.request(_RTM_DELLINK, 0, _ifinfo() + _name(name), f"delete {name}")
    finally:
        sock.close()


def nft_chain_exists(family: int, table: str, chain: str) -> bool:
    """Whether this namespace's nftables has ``chain`` in ``table`` of
    ``family`` (``socket.AF_INET`` for ``ip``): one netlink request."""
    sock = _Socket(_NETLINK_NETFILTER)
    try:
        body = struct.pack("=BBH", family, 0, 0)
        body += _attr(_NFTA_CHAIN_TABLE, table.encode() + b"\0") + _attr(_NFTA_CHAIN_NAME, chain.encode() + b"\0")
        for msg_type, data, at in sock._replies(_NFNL_SUBSYS_NFTABLES << 8 | _NFT_MSG_GETCHAIN, 0, body):
            if msg_type == _NLMSG_ERROR:
                (error,) = struct.unpack_from("=i", data, at)
                if error in (-errno.ENOENT, 0):
                    return False
                raise NetlinkError(-error, f"nft chain {table} {chain}: {os.strerror(-error)}")
            return True
        return False
    finally:
        sock.close()


_libc = ctypes.CDLL(None, use_errno=True)


def in_namespace_fd(fd: int, fn):  # type: ignore[no-untyped-def]
    """Return ``fn()`` run in a new thread inside the network namespace ``fd`` holds."""
    result: list[object] = []

    def body() -> None:
        _setns(fd, "the session's network namespace")
        result.append(fn())

    _in_thread(body)
    return result[0]


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into {what}: {os.strerror(err)}")


def _in_thread(fn) -> None:  # type: ignore[no-untyped-def]
    """Run ``fn()`` in a thread of its own, which ends right after: whatever
    namespace it entered goes with it. Its exception is raised here."""
    failure: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            failure.append(exc)

    thread = threading.Thread(target=body, name="sandbox-netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
