"""SMB3 persistent handles (Samba 4.25) survive an smbd crash and restart.

A client opens a file with a persistent handle on a continuously available
share and takes a byte-range lock. smbd is killed (SIGKILL, everything it
forked) and started again on the same folder and port: the volatile
databases are cleared at that start, except for the records Samba stored
with DBWRAP_STORE_PERSISTENT. Another client is then refused the file, the
first one reclaims its handle (same client GUID, DH2C) and finds its lock
still held. Natively, on the bridge with tdb, etcd and etcd with the node
cache; and on the broken example that drops the durable copies, where the
reclaim must fail: the test sees a lost persistent handle.

Before Samba 4.25 there are no persistent handles: the tests skip.
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from dbwrap_py.paths import built_samba_release
from dbwrap_py.samba import ThrowawaySamba
from dbwrap_py.servers import backend_options
from dbwrap_py.smbtorture import setup_for

pytestmark = pytest.mark.skipif(
    tuple(int(p) for p in built_samba_release().split(".")) < (4, 25, 0),
    reason=f"Samba {built_samba_release()} has no persistent handles (from 4.25)")

# imported after the skip: smbprotocol's persistent-handle capability is only asked for here
from dbwrap_py.testing.smb_client import (STATUS_FILE_NOT_AVAILABLE, STATUS_OBJECT_NAME_NOT_FOUND,  # noqa: E402
                                          STATUS_RANGE_NOT_LOCKED, WRITE, SHARE_READ, SmbClient, status_of)

CONFIGS = {
    "native": None,
    "tdb": ("tdb", {}),
    "etcd": ("etcd", {}),
    "etcd+node_cache": ("etcd", {"node_cache": "yes"}),
}
NAME = "persistent.dat"


@pytest.fixture
def restartable(request) -> Iterator[Callable[[], ThrowawaySamba]]:
    """start(): a persistent-handle smbd on one folder and port, the same
    each time (keep=True); its backend's throwaway server outlives them."""
    with ExitStack() as stack:
        config = CONFIGS[request.param] if isinstance(request.param, str) else request.param
        if config is None:
            setup = setup_for("native", persistent_handles=True)
        else:
            adapter, options = config
            reach = stack.enter_context(backend_options(adapter, options))
            setup = setup_for("bridge", adapter, reach, persistent_handles=True)
        started: list[ThrowawaySamba] = []

        def start() -> ThrowawaySamba:
            # its own folder (pytest's tmp_path is closed to the share's user), then the same again
            again = dict(port=started[0].port, add_user=False) if started else {}
            samba = ThrowawaySamba(dataclasses.replace(setup, **again), keep=True,
                                   root=started[0].root if started else None)
            started.append(samba)
            samba.start()
            return samba

        try:
            yield start
        finally:
            for samba in started:
                samba.stop()
            if started:
                shutil.rmtree(started[0].root, ignore_errors=True)


def crash_and_restart(samba: ThrowawaySamba, start: Callable[[], ThrowawaySamba]) -> ThrowawaySamba:
    samba.kill()
    samba.stop()  # keep=True: the folder stays
    return start()


def open_locked(samba: ThrowawaySamba, client_guid: uuid.UUID, create_guid: uuid.UUID) -> bytes:
    """A persistent handle with bytes 0-9 locked; the client vanishes
    without closing anything. Returns the handle's file id."""
    client = SmbClient("127.0.0.1", samba.port, client_guid)
    handle = client.open_persistent(NAME, create_guid)
    assert handle.persistent, "smbd granted no persistent handle"
    client.lock(handle, 0, 10)
    client.abandon()
    return handle.file_id


@pytest.mark.parametrize("restartable", list(CONFIGS), indirect=True)
def test_a_persistent_handle_and_its_lock_survive_an_smbd_restart(restartable):
    client_guid, create_guid = uuid.uuid4(), uuid.uuid4()
    samba = restartable()
    file_id = open_locked(samba, client_guid, create_guid)
    samba = crash_and_restart(samba, restartable)

    other = SmbClient("127.0.0.1", samba.port)
    assert status_of(lambda: other.open(NAME, WRITE, SHARE_READ)) == STATUS_FILE_NOT_AVAILABLE
    other.close()

    owner = SmbClient("127.0.0.1", samba.port, client_guid)
    handle = owner.reclaim(NAME, file_id, create_guid)
    assert handle.file_id[:8] == file_id[:8]  # the persistent half of the id
    assert status_of(lambda: owner.lock(handle, 0, 10, unlock=True)) == 0, "the lock was not held"
    assert status_of(lambda: owner.lock(handle, 0, 10, unlock=True)) == STATUS_RANGE_NOT_LOCKED
    owner.close()


@pytest.mark.parametrize("restartable", [("dbwrap_py.conformance.broken.forgets_copy", {})], indirect=True)
def test_a_backend_that_drops_the_durable_copy_loses_the_handle(restartable):
    """The broken example keeps everything but the copies: after the restart
    the open is gone, and the reclaim above would fail."""
    client_guid, create_guid = uuid.uuid4(), uuid.uuid4()
    samba = restartable()
    file_id = open_locked(samba, client_guid, create_guid)
    samba = crash_and_restart(samba, restartable)
    owner = SmbClient("127.0.0.1", samba.port, client_guid)
    assert status_of(lambda: owner.reclaim(NAME, file_id, create_guid)) == STATUS_OBJECT_NAME_NOT_FOUND
    owner.close()
