"""A slow link to a real server: a TCP relay on 127.0.0.1 that holds every
request ``delay`` seconds before passing it on, and drops what it still
holds when the client hangs up first.

That is how a store looks whose answers are late but which is alive: etcd
renews a lease only once it has applied what it committed, so a slow disk
delays every keepalive, and a keepalive whose client gave up is cancelled.
Answers come back at once; only requests wait.

    with SlowLink("http://127.0.0.1:2379", delay=0.9) as link:
        open_etcd(link.endpoint, ...)
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from types import TracebackType
from urllib.parse import urlsplit


class SlowLink:
    def __init__(self, target: str, delay: float) -> None:
        url = urlsplit(target if "//" in target else f"http://{target}")
        self.scheme = url.scheme or "http"
        self.target = (url.hostname or "127.0.0.1", url.port or 80)
        self.delay = delay
        self.dropped = 0  # requests the client gave up on before they were passed on
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = [self._listener]
        self._mutex = threading.Lock()
        self._closed = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> SlowLink:
        threading.Thread(target=self._accept, daemon=True, name="slow-link").start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._closed.set()
        with self._mutex:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                return
            server.settimeout(None)
            with self._mutex:
                self._sockets += [client, server]
            _Relay(self, client, server).start()


class _Relay:
    """One connection: requests held ``delay`` s in order, answers at once."""

    def __init__(self, link: SlowLink, client: socket.socket, server: socket.socket) -> None:
        self.link, self.client, self.server = link, client, server
        self.held: collections.deque[tuple[float, bytes]] = collections.deque()
        self.client_gone = False
        self.ready = threading.Condition()

    def start(self) -> None:
        for target in (self._read_requests, self._pass_requests_on, self._answer):
            threading.Thread(target=target, daemon=True).start()

    def _read_requests(self) -> None:
        while True:
            try:
                chunk = self.client.recv(65536)
            except OSError:
                chunk = b""
            with self.ready:
                if not chunk:
                    self.client_gone = True
                else:
                    self.held.append((time.monotonic() + self.link.delay, chunk))
                self.ready.notify()
            if not chunk:
                return

    def _pass_requests_on(self) -> None:
        while True:
            with self.ready:
                while not self.held and not self.client_gone:
                    self.ready.wait()
                if not self.held:
                    break
                due, chunk = self.held[0]
                if time.monotonic() < due:
                    self.ready.wait(due - time.monotonic())
                    continue  # look again: the client may have hung up meanwhile
                if self.client_gone:
                    break
                self.held.popleft()
            try:
                self.server.sendall(chunk)
            except OSError:
                break
        with self.ready:
            self.link.dropped += len(self.held)
            self.held.clear()
        self.server.close()

    def _answer(self) -> None:
        while True:
            try:
                chunk = self.server.recv(65536)
                if not chunk:
                    break
                self.client.sendall(chunk)
            except OSError:
                break
        self.client.close()
