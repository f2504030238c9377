"""Which TCP addresses a process listens on, read from /proc (iproute2 is
not a dependency). Shared by the server tests that check a daemon binds to
127.0.0.1 only."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

#: /proc/net/tcp's state column for LISTEN
_LISTEN = "0A"


def listening(pid: int) -> list[str]:
    """``pid``'s listening addresses as host:port, sorted; an IPv4-mapped
    IPv6 address as IPv4, another IPv6 one as [host]:port."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed since the listing: the daemon's threads run on
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN and fields[9] in inodes:
                found.append(_address(fields[1]))
    return sorted(found)


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    packed = bytes.fromhex(host)
    # /proc/net prints each 32-bit word of the address in host (little-endian) order
    address = ipaddress.ip_address(b"".join(packed[i:i + 4][::-1] for i in range(0, len(packed), 4)))
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is None:
            return f"[{address}]:{int(port, 16)}"
        address = address.ipv4_mapped  # Java binds IPv4 addresses on an IPv6 socket
    return f"{address}:{int(port, 16)}"
