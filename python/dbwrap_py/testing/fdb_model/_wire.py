"""The model's wire format: length-prefixed ``marshal`` frames on a stream
socket, a unix socket or TCP; and where the server listens, as a cluster
file names it.

marshal carries exactly what crosses (bytes, ints, None, tuples, lists) and
never builds arbitrary objects, so a frame cannot run code in the reader.

A cluster file's content is one line, ``<description>@unix:<socket path>``
or ``<description>@tcp:<IPv4 address>:<port>``. Neither is a real
FoundationDB cluster file (``<description>:<id>@<ip>:<port>,...``), so the
model's client never talks to a real cluster, nor a real client to the model.
"""

from __future__ import annotations

import ipaddress
import marshal
import socket
import struct
from typing import Any, TypeAlias

_HEADER = struct.Struct(">I")

#: where the model's server listens: a unix socket's path, or (IPv4 address, port)
Address: TypeAlias = str | tuple[str, int]

#: the forms a cluster file may take, for error messages
FORMS = "<description>@unix:<socket path> or <description>@tcp:<IPv4 address>:<port>"

#: a TCP connect to an address nothing answers would otherwise wait for the
#: kernel's SYN retries (about two minutes); tests want an answer sooner
CONNECT_TIMEOUT = 10.0


def cluster_text(description: str, address: Address) -> str:
    """The cluster file's content naming ``address``."""
    if isinstance(address, str):
        return f"{description}@unix:{address}\n"
    return f"{description}@tcp:{address[0]}:{address[1]}\n"


def parse_cluster_text(text: str) -> Address:
    """The address a cluster file's content names; ValueError saying what is
    wrong when it is neither of FORMS."""
    description, at, where = text.strip().partition("@")
    kind, _, rest = where.partition(":")
    if not description or not at or not rest or kind not in ("unix", "tcp"):
        raise ValueError(f"{text.strip()[:200]!r} is not {FORMS}")
    return rest if kind == "unix" else _tcp_address(rest)


def _tcp_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        address = ipaddress.IPv4Address(host)
        number = int(port)
    except ValueError:
        raise ValueError(f"tcp:{text!r} is not tcp:<IPv4 address>:<port>") from None
    if not 0 < number < 65536:
        raise ValueError(f"tcp:{text!r}: port {number} is out of range")
    return str(address), number


def connect(address: Address) -> socket.socket:
    """A connected, blocking socket to the server at ``address``; OSError if
    nothing answers there."""
    tcp = not isinstance(address, str)
    sock = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if tcp:  # a unix socket's connect answers at once, as it always did
            no_delay(sock)
            sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(address)
        sock.settimeout(None)  # a watch request blocks for its slice, a commit as long as it takes
    except OSError:
        sock.close()
        raise
    return sock


def no_delay(sock: socket.socket) -> None:
    """Send each frame at once: the model's messages are small request/replies,
    which Nagle's algorithm would hold for the peer's delayed ACK (~40 ms)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def send(sock: socket.socket, message: Any) -> None:
    body = marshal.dumps(message)
    sock.sendall(_HEADER.pack(len(body)) + body)


def _exactly(sock: socket.socket, n: int) -> bytes:
    parts = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the FoundationDB model's server closed the connection")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def receive(sock: socket.socket) -> Any:
    (length,) = _HEADER.unpack(_exactly(sock, _HEADER.size))
    return marshal.loads(_exactly(sock, length))
