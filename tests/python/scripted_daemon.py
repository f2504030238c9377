"""A node daemon that answers as it is told, for the C client's tests
(test_proxy_client.py): one attack each, against build/proxy_client.

    python scripted_daemon.py SOCKET CONFIG_FILE

CONFIG_FILE holds JSON: {"scripts": [{OP: REPLY, ...}, ...], "uid": N, "drop": "before-bind"
| "after-bind"}. Connection i (from 0) follows scripts[i], the last one for
every later connection; an op it does not name gets DEFAULTS. REPLY is
"ok" (the op's fields from DEFAULTS), "close" (hang up instead),
{"error": STATUS, "cause_hex": HEX}, {"hello": [VERSION, MAX_MESSAGE]} or
{"raw_hex": HEX} (that body, as it is).
With "uid", the process becomes that user (and its group) before bind()
or between bind() and listen(): SO_PEERCRED reports the credentials of
listen().

It prints "listening" once it accepts, then one line per event, flushed:
"conn I op NAME db H" for each request, "conn I end BYTES" when the client
closes (BYTES: all it sent). SIGTERM (after the client is gone) takes the
connections still waiting to be accepted, waits for every connection's
end line, and exits 0: the lines are complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading

from dbwrap_py import ntstatus as nt
from dbwrap_py.proxy import wire
from dbwrap_py.proxy.wire import Op

DEFAULTS: dict[Op, bytes] = {
    Op.HELLO: wire.reply_ok().u16(wire.VERSION).u32(wire.MAX_MESSAGE).message(),
    Op.OPEN: wire.reply_ok().u32(1).message(),
    Op.NODE_CACHE: wire.reply_error(nt.NT_STATUS_NOT_SUPPORTED, "no node cache"),
    Op.FETCH: wire.reply_ok().opt(None).message(),
    Op.LOCK: wire.reply_ok().opt(None).message(),
    Op.EXISTS: wire.reply_ok().u8(0).message(),
    Op.SEQNUM: wire.reply_ok().u32(0).message(),
    Op.TRAVERSE_START: wire.reply_ok().u32(1).message(),
    Op.TRAVERSE_NEXT: wire.reply_ok().u8(0).message(),
    Op.DB_ID: wire.reply_ok().bytes(b"id").message(),
}
_lock = threading.Lock()


def say(line: str) -> None:
    with _lock:
        print(line, flush=True)


def reply(spec: object, op: Op) -> bytes | None:
    if spec == "ok":
        return DEFAULTS.get(op, wire.reply_ok().message())
    if spec == "close":
        return None
    assert isinstance(spec, dict), spec
    if "raw_hex" in spec:
        return wire.Writer().bytes(bytes.fromhex(spec["raw_hex"])).body()  # the length, the body
    if "hello" in spec:
        version, max_message = spec["hello"]
        return wire.reply_ok().u16(version).u32(max_message).message()
    return wire.Writer().u32(spec["error"]).bytes(bytes.fromhex(spec["cause_hex"])).message()


def serve(index: int, sock: socket.socket, script: dict[str, object]) -> None:
    received = 0
    with sock, contextlib.suppress(OSError):
        while True:
            head = sock.recv(4, socket.MSG_WAITALL)
            received += len(head)
            if len(head) < 4:
                break
            (length,) = wire.LENGTH.unpack(head)
            body = sock.recv(length, socket.MSG_WAITALL)
            received += len(body)
            op, _, _, db = wire.REQUEST_HEADER.unpack_from(body)
            say(f"conn {index} op {Op(op).name} db {db}")
            answer = reply(script.get(Op(op).name, "ok"), Op(op))
            if answer is None:
                break
            sock.sendall(answer)
    say(f"conn {index} end {received}")


def become(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def main() -> None:
    path = sys.argv[1]
    with open(sys.argv[2]) as config_file:
        config = json.load(config_file)
    scripts = config["scripts"]
    if config.get("drop") == "before-bind":
        become(config["uid"])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    if config.get("drop") == "after-bind":
        become(config["uid"])
    listener.listen(8)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    listener.settimeout(0.05)
    say("listening")
    threads: list[threading.Thread] = []
    while True:
        try:
            sock, _ = listener.accept()
        except (TimeoutError, BlockingIOError):
            if not stopping.is_set():
                continue
            if listener.gettimeout() == 0.0:
                break
            listener.setblocking(False)  # to the last: connections made before the client ended
            continue
        sock.setblocking(True)
        script = scripts[min(len(threads), len(scripts) - 1)]
        threads.append(threading.Thread(target=serve, args=(len(threads), sock, script), daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join(5)


if __name__ == "__main__":
    main()
