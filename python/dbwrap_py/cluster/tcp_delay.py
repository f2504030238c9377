"""A network profile's delay without netem: a relay in a node's namespace
holds every chunk of the node's outgoing TCP connections for the
profile's one-way delay, each way.

An nft table of our own (``TABLE``) in the node's namespace redirects the
node's new TCP connections to the other nodes' addresses and the bridge
address (where the backend's server listens) to the relay, on the
namespace's loopback. The relay asks the kernel where each connection was
going (``SO_ORIGINAL_DST``), connects there from the same source address
with a socket carrying ``MARK``, which the table lets through, and passes
the bytes on both ways, each chunk no earlier than its arrival plus the
delay and a jitter drawn for it, and never before the chunk ahead of it
(no reordering within a connection). The connection itself is made one
round trip after the relay accepts it, as a handshake would take; until
then the client's data waits in its socket. What the node receives is
delayed by the relay of the node that made the connection, so a round trip
pays the delay twice, as with netem; connections from the caller's
namespace (smbtorture to smbd) are not delayed.

Some destinations may be further (``--far ADDR``, repeated, with
``--far-delay-ms`` and ``--far-jitter-ms``): a connection whose original
destination is one of them is held by the far delay both ways, handshake
included, instead of the node's own (a profile with far nodes, netem.py).

The relay's event loop waits on a timer of its own (``fine_selector``), so
a hold of 0.1 ms lasts 0.1 ms and some tens of microseconds, not the whole
millisecond epoll's timeout would round it up to.

Each direction keeps at most ``QUEUE_CHUNKS`` chunks of ``CHUNK`` bytes;
an end of stream is passed on (after the delay) as a shutdown of writing;
when both directions have ended, or either fails, both sockets close.
The table goes with the namespace; the relay is stopped by its PID.

Run as ``python -I -m dbwrap_py.cluster.tcp_delay --delay-ms D --jitter-ms J
[--far ADDR ... --far-delay-ms F --far-jitter-ms G]`` inside the namespace:
it prints its port on a line, then relays until SIGTERM, writing one line
to stderr per failed connection.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import random
import selectors
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dbwrap_py.cluster import fine_selector

#: the nft table (inet family) each node namespace gets
TABLE = "dbwrap_tcp_delay"
#: the firewall mark of the relay's own connections, which the table lets through
MARK = 0xDB7C
NFT = "nft"
CHUNK = 64 * 1024
QUEUE_CHUNKS = 64
CONNECT_TIMEOUT_S = 10.0
START_TIMEOUT_S = 30.0
SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h


class TcpDelayError(RuntimeError):
    """The relay or its nft table could not be set up."""


@dataclass(frozen=True)
class Hold:
    """How long one direction holds a chunk: ``delay_ms`` plus a jitter
    drawn uniformly from [-jitter_ms, jitter_ms] (never below zero)."""

    delay_ms: float
    jitter_ms: float = 0.0

    def sample_s(self) -> float:
        jitter = random.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms > 0 else 0.0
        return max(self.delay_ms + jitter, 0.0) / 1000


# -- the nft table ----------------------------------------------------------------


def ruleset(port: int, destinations: Sequence[str]) -> str:
    """The nft script that sends new TCP connections to ``destinations`` to
    the relay at 127.0.0.1:``port``, except the relay's own (``MARK``)."""
    addresses = ", ".join(destinations)
    return (f"table ip {TABLE} {{\n"
            f"  chain output {{\n"
            f"    type nat hook output priority -100; policy accept;\n"
            f"    meta mark {MARK:#x} return\n"
            f"    ip daddr {{ {addresses} }} meta l4proto tcp redirect to :{port}\n"
            f"  }}\n"
            f"}}\n")


def _nft(exec_prefix: Sequence[str], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*exec_prefix, NFT, "-f", "-"], input=script, capture_output=True,
                          text=True, timeout=30)


def tcp_delay_missing() -> str:
    """Why the relay's redirect cannot be set here, or '' when it can: the
    table is loaded in a network namespace made for it (``unshare -n``),
    which goes with the command."""
    try:
        result = _nft(["unshare", "-n"], ruleset(1, ["10.254.0.1"]))
    except FileNotFoundError as exc:
        return f"{exc.filename} is not installed (nft is in nftables, unshare in util-linux)"
    if result.returncode == 0:
        return ""
    return f"unshare -n nft -f - (a redirect in table {TABLE}) failed: {result.stderr.strip()}"


# -- the relay process, seen from the network ---------------------------------------


@dataclass
class TcpDelayRelay:
    """One namespace's relay and its nft table: start() starts the relay,
    waits for its port and loads the table; stop() ends the relay by PID.
    Connections to ``far`` (some of ``destinations``) are held by
    ``far_hold`` both ways instead of ``sends`` and ``replies``."""

    exec_prefix: Sequence[str]
    namespace: str
    destinations: Sequence[str]
    sends: Hold
    replies: Hold
    log: Path | None = None
    process: subprocess.Popen[str] | None = None
    far: Sequence[str] = ()
    far_hold: Hold = Hold(0.0)

    def command(self) -> list[str]:
        far = [arg for address in self.far for arg in ("--far", address)]
        if far:
            far += ["--far-delay-ms", f"{self.far_hold.delay_ms:g}",
                    "--far-jitter-ms", f"{self.far_hold.jitter_ms:g}"]
        return [*self.exec_prefix, sys.executable, "-I", "-m", __name__,
                "--delay-ms", f"{self.sends.delay_ms:g}", "--jitter-ms", f"{self.sends.jitter_ms:g}",
                "--reply-delay-ms", f"{self.replies.delay_ms:g}",
                "--reply-jitter-ms", f"{self.replies.jitter_ms:g}", *far]

    def start(self) -> None:
        log: IO[str] | None = open(self.log, "a") if self.log is not None else None
        try:
            self.process = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log,
                                            text=True, start_new_session=True)
        finally:
            if log is not None:
                log.close()
        port = self._port()
        result = _nft(self.exec_prefix, ruleset(port, self.destinations))
        if result.returncode != 0:
            raise TcpDelayError(f"tcp delay in {self.namespace}: nft -f - (table {TABLE}) failed "
                                f"({result.returncode}): {result.stderr.strip()}")

    def _port(self) -> int:
        assert self.process is not None and self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            ready = selector.select(START_TIMEOUT_S)
        line = self.process.stdout.readline().strip() if ready else ""
        if not line.isdigit():
            raise TcpDelayError(f"tcp delay in {self.namespace}: the relay gave no port within "
                                f"{START_TIMEOUT_S:g}s (exit status {self.process.poll()}, "
                                f"log {self.log or 'stderr'})")
        return int(line)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        from dbwrap_py.servers import stop_process_group

        if self.process is not None:
            if self.process.poll() is None:  # one process: ip netns exec execs python
                stop_process_group(self.process)
            if self.process.stdout is not None:
                self.process.stdout.close()


# -- the relay itself ------------------------------------------------------------------


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a redirected connection was going (its conntrack entry's)."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return str(ipaddress.IPv4Address(packed)), port


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: Hold) -> None:
    """Pass ``reader``'s chunks to ``writer``, each held by ``hold`` and in order."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)

    async def read() -> None:
        last = 0.0
        while True:
            chunk = await reader.read(CHUNK)
            last = max(loop.time() + hold.sample_s(), last)
            await queue.put((last, chunk))
            if not chunk:
                return

    async def write() -> None:
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(due - loop.time(), 0.0))
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()

    async with asyncio.TaskGroup() as group:
        group.create_task(read())
        group.create_task(write())


async def _connect(source: str, destination: tuple[str, int]) -> socket.socket:
    loop = asyncio.get_running_loop()
    out = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        out.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
        out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out.setblocking(False)
        out.bind((source, 0))
        await asyncio.wait_for(loop.sock_connect(out, destination), CONNECT_TIMEOUT_S)
        return out
    except BaseException:
        out.close()
        raise


class Relay:
    """Holds what a connection sends by ``sends`` and its replies by
    ``replies``; a connection to an address of ``far`` by its hold there,
    both ways."""

    def __init__(self, sends: Hold, replies: Hold, far: Mapping[str, Hold] | None = None) -> None:
        self.sends, self.replies = sends, replies
        self.far = dict(far or {})

    def holds(self, address: str) -> tuple[Hold, Hold]:
        """(sends, replies) of a connection to ``address``."""
        far = self.far.get(address)
        return (far, far) if far is not None else (self.sends, self.replies)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = writer.get_extra_info("socket")
        source = writer.get_extra_info("peername")
        name = f"{source[0]}:{source[1]}"
        writers = [writer]
        try:
            destination = original_destination(client)
            name += f" -> {destination[0]}:{destination[1]}"
            sends, replies = self.holds(destination[0])
            # the handshake's round trip: SYN there, SYN-ACK back
            await asyncio.sleep(sends.sample_s() + replies.sample_s())
            out = await _connect(source[0], destination)
            out_reader, out_writer = await asyncio.open_connection(sock=out, limit=CHUNK)
            writers.append(out_writer)
            async with asyncio.TaskGroup() as group:
                group.create_task(_forward(reader, out_writer, sends))
                group.create_task(_forward(out_reader, writer, replies))
        except Exception as exc:  # one line per failed connection, then it is closed
            print(f"tcp delay: {name}: {_reason(exc)}", file=sys.stderr, flush=True)
            if len(writers) == 1:  # never connected: the client sees a reset, as from a refusal
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        finally:
            for each in writers:
                each.close()

    async def serve(self) -> None:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0, limit=CHUNK)
        print(server.sockets[0].getsockname()[1], flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with server:
            await stop.wait()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(e) for e in exc.exceptions)
    if isinstance(exc, TimeoutError):
        return f"no connection within {CONNECT_TIMEOUT_S:g}s"
    return f"{type(exc).__name__}: {exc}"


def relay_from(argv: Sequence[str] | None = None) -> Relay:
    """The relay its command line (``argv``; None: sys.argv's) describes."""
    parser = argparse.ArgumentParser(prog="tcp_delay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, required=True, help="what the node sends")
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--reply-delay-ms", type=float, help="what it receives (default: --delay-ms)")
    parser.add_argument("--reply-jitter-ms", type=float, help="default: --jitter-ms")
    parser.add_argument("--far", action="append", default=[], metavar="ADDR",
                        help="a destination held by --far-delay-ms both ways instead (repeatable)")
    parser.add_argument("--far-delay-ms", type=float, default=0.0)
    parser.add_argument("--far-jitter-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    sends = Hold(args.delay_ms, args.jitter_ms)
    replies = Hold(args.delay_ms if args.reply_delay_ms is None else args.reply_delay_ms,
                   args.jitter_ms if args.reply_jitter_ms is None else args.reply_jitter_ms)
    far = Hold(args.far_delay_ms, args.far_jitter_ms)
    return Relay(sends, replies, {str(ipaddress.IPv4Address(address)): far for address in args.far})


def main(argv: Sequence[str] | None = None) -> int:
    fine_selector.run(relay_from(argv).serve())  # holds under 1 ms last what they say
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
