"""The model's wire format: length-prefixed ``marshal`` frames on a unix socket.

marshal carries exactly what crosses (bytes, ints, None, tuples, lists) and
never builds arbitrary objects, so a frame cannot run code in the reader.
"""

from __future__ import annotations

import marshal
import socket
import struct
from typing import Any

_HEADER = struct.Struct(">I")


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
