"""An SMB2 client for the cross-node checks and persistent handles:
smbprotocol (pure Python; it takes a port, share access, byte-range locks,
oplock levels and durable-handle contexts, which smbclient and Samba's 4.17
bindings do not all offer).

smbprotocol does not handle a server's unsolicited oplock break: its reader
thread stops on one. ``BreakWatch`` sits between the client and smbd, a
TCP relay that counts the server's OPLOCK_BREAK notifications and keeps
them from the client. The checks only take level II oplocks, whose break
needs no acknowledgement, so the server never waits for one.
"""

from __future__ import annotations

import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from smbprotocol.connection import Capabilities, Connection, Dialects
from smbprotocol.create_contexts import (CreateContextName, DurableHandleFlags, LeaseState, SMB2CreateContextRequest,
                                         SMB2CreateDurableHandleReconnectV2, SMB2CreateDurableHandleRequest,
                                         SMB2CreateDurableHandleRequestV2, SMB2CreateDurableHandleResponse,
                                         SMB2CreateDurableHandleResponseV2, SMB2CreateRequestLeaseV2,
                                         SMB2CreateResponseLeaseV2)
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.open import (CreateDisposition, CreateOptions, FileAttributes, FilePipePrinterAccessMask,
                              ImpersonationLevel, LockFlags, Open, RequestedOplockLevel, ShareAccess,
                              SMB2LockElement)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

from dbwrap_py.samba import SHARE, TEST_PASSWORD, TEST_USER

READ = FilePipePrinterAccessMask.FILE_READ_DATA | FilePipePrinterAccessMask.FILE_READ_ATTRIBUTES
WRITE = READ | FilePipePrinterAccessMask.FILE_WRITE_DATA
SHARE_READ = ShareAccess.FILE_SHARE_READ
SHARE_ALL = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE
#: a persistent handle's open: FILE_OVERWRITE_IF needs more than WRITE
READ_WRITE = FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE
OPLOCK_II = RequestedOplockLevel.SMB2_OPLOCK_LEVEL_II
#: a durable handle (SMB2_CREATE_DURABLE_HANDLE_REQUEST) needs a batch oplock (or a handle lease)
OPLOCK_BATCH = RequestedOplockLevel.SMB2_OPLOCK_LEVEL_BATCH

#: what a disconnected persistent handle's share mode answers another opener
STATUS_FILE_NOT_AVAILABLE = 0xC0000467
STATUS_RANGE_NOT_LOCKED = 0xC000007E
STATUS_OBJECT_NAME_NOT_FOUND = 0xC0000034

SMB2_OPLOCK_BREAK = 0x12
UNSOLICITED = 0xFFFFFFFFFFFFFFFF
TIMEOUT = 30


def status_of(call) -> int:
    """The NTSTATUS a call ends with: 0 for success."""
    try:
        call()
    except SMBResponseException as exc:
        return exc.status
    return 0


class SmbClient:
    """One connection, session and tree connect to a node's share."""

    def __init__(self, address: str, port: int, client_guid: uuid.UUID | None = None,
                 share: str | None = None) -> None:
        """``client_guid``: the same one again to reclaim handles after a
        reconnect; ``share``: another than the throwaway Samba's test share."""
        self.connection = Connection(client_guid or uuid.uuid4(), address, port)
        # persistent handles (SMB 3): the client must say it takes them
        self.connection.client_capabilities |= Capabilities.SMB2_GLOBAL_CAP_PERSISTENT_HANDLES
        self.connection.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
        self.session = Session(self.connection, TEST_USER, TEST_PASSWORD, require_encryption=False)
        self.session.connect()
        self.tree = TreeConnect(self.session, rf"\\{address}\{share or SHARE}")
        self.tree.connect()

    def open(self, name: str, access: int, share: int, oplock: int = 0, durable: bool = False) -> Open:
        """``durable``: ask for a durable handle; ``handle.durable`` says if
        the server granted it (its create response carries the context)."""
        handle = Open(self.tree, name)
        replies = handle.create(ImpersonationLevel.Impersonation, access, FileAttributes.FILE_ATTRIBUTE_NORMAL,
                                share, CreateDisposition.FILE_OPEN_IF, CreateOptions.FILE_NON_DIRECTORY_FILE,
                                oplock_level=oplock or RequestedOplockLevel.SMB2_OPLOCK_LEVEL_NONE,
                                create_contexts=[SMB2CreateDurableHandleRequest()] if durable else None)
        handle.durable = any(isinstance(reply, SMB2CreateDurableHandleResponse) for reply in replies or ())
        return handle

    def open_persistent(self, name: str, create_guid: uuid.UUID, timeout_ms: int = 60000,
                        lease_key: bytes | None = None) -> Open:
        """A new file, read-write, with a persistent handle asked for
        (SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2; no oplock: Samba 4.25 grants
        none with one) and, with ``lease_key``, a read-write-handle lease;
        ``handle.persistent`` says if it was granted, ``handle.lease_state``
        which lease (None: none)."""
        request = SMB2CreateDurableHandleRequestV2()
        request["timeout"] = timeout_ms
        request["flags"] = DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT
        request["create_guid"] = create_guid
        contexts = [_context(CreateContextName.SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2, request)]
        handle = Open(self.tree, name)
        replies = handle.create(ImpersonationLevel.Impersonation, READ_WRITE, FileAttributes.FILE_ATTRIBUTE_NORMAL,
                                SHARE_READ, CreateDisposition.FILE_OVERWRITE_IF,
                                CreateOptions.FILE_NON_DIRECTORY_FILE, **_leased(contexts, lease_key))
        handle.persistent = any(isinstance(reply, SMB2CreateDurableHandleResponseV2) and
                                reply["flags"].has_flag(DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT)
                                for reply in replies or ())
        handle.lease_state = _lease_state(replies)
        return handle

    def reclaim(self, name: str, file_id: bytes, create_guid: uuid.UUID, lease_key: bytes | None = None) -> Open:
        """Reconnect to a persistent handle (SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2)
        after the connection, or the server, went away; with the lease key
        its open had. ``handle.lease_state``: the lease it has now."""
        request = SMB2CreateDurableHandleReconnectV2()
        request["file_id"] = file_id
        request["create_guid"] = create_guid
        request["flags"] = DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT
        contexts = [_context(CreateContextName.SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2, request)]
        handle = Open(self.tree, name)
        replies = handle.create(ImpersonationLevel.Impersonation, READ_WRITE, FileAttributes.FILE_ATTRIBUTE_NORMAL,
                                SHARE_READ, CreateDisposition.FILE_OPEN, CreateOptions.FILE_NON_DIRECTORY_FILE,
                                **_leased(contexts, lease_key))
        handle.lease_state = _lease_state(replies)
        return handle

    @staticmethod
    def lock(handle: Open, offset: int, length: int, unlock: bool = False) -> None:
        """An exclusive byte-range lock (or its unlock), failing at once on a conflict."""
        element = SMB2LockElement()
        element["offset"] = offset
        element["length"] = length
        element["flags"] = (LockFlags.SMB2_LOCKFLAG_UNLOCK if unlock else
                            LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY)
        handle.lock([element])

    def close(self) -> None:
        self.connection.disconnect(True)

    def abandon(self) -> None:
        """Drop the connection without a word to the server (it is dead)."""
        self.connection.disconnect(False)


def _leased(contexts: list[SMB2CreateContextRequest], lease_key: bytes | None) -> dict[str, object]:
    """create()'s oplock level and contexts, with a lease (v2) asked for
    read, write and handle caching under ``lease_key``."""
    if lease_key is None:
        return {"create_contexts": contexts}
    lease = SMB2CreateRequestLeaseV2()
    lease["lease_key"] = lease_key
    lease["lease_state"] = (LeaseState.SMB2_LEASE_READ_CACHING | LeaseState.SMB2_LEASE_WRITE_CACHING |
                            LeaseState.SMB2_LEASE_HANDLE_CACHING)
    lease["parent_lease_key"] = b"\0" * 16
    lease["epoch"] = b"\0\0"
    return {"oplock_level": RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE,
            "create_contexts": [*contexts, _context(CreateContextName.SMB2_CREATE_REQUEST_LEASE_V2, lease)]}


def _lease_state(replies: object) -> int | None:
    for reply in replies or ():  # type: ignore[attr-defined]
        if isinstance(reply, SMB2CreateResponseLeaseV2):
            return int(reply["lease_state"].get_value())
    return None


def _context(name: int, data: object) -> SMB2CreateContextRequest:
    context = SMB2CreateContextRequest()
    context["buffer_name"] = name
    context["buffer_data"] = data
    return context


@contextmanager
def smb_client(address: str, port: int) -> Iterator[SmbClient]:
    client = SmbClient(address, port)
    try:
        yield client
    finally:
        client.close()


class BreakWatch:
    """A relay on 127.0.0.1 to ``address``:``port`` that counts (and drops)
    the server's oplock break notifications; one client connection."""

    def __init__(self, address: str, port: int) -> None:
        self.target = (address, port)
        self.breaks = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> "BreakWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self._sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        server = socket.create_connection(self.target, timeout=TIMEOUT)
        server.settimeout(None)
        self._sockets += [client, server]
        threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
        self._pump(server, client, True)

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        """Whole messages (a 4-byte length, then the SMB2 header) from
        ``source`` to ``sink``; breaks from the server are counted, not sent."""
        try:
            while True:
                head = _read_exactly(source, 4)
                body = _read_exactly(source, struct.unpack(">I", head)[0] & 0xFFFFFF)
                if from_server and _is_break_notification(body):
                    self.breaks += 1
                    continue
                sink.sendall(head + body)
        except OSError:
            pass


def _is_break_notification(message: bytes) -> bool:
    """An SMB2 OPLOCK_BREAK the server sends unasked (MessageId all ones)."""
    return (len(message) >= 64 and message[:4] == b"\xfeSMB"
            and struct.unpack_from("<H", message, 12)[0] == SMB2_OPLOCK_BREAK
            and struct.unpack_from("<Q", message, 24)[0] == UNSOLICITED)


def _read_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data
