"""The node cache: records live on the node that uses them, for any adapter.

With every record operation a round trip to a remote store, an SMB2
open+close costs some 27 round trips, paid under smbd's share-mode lock.
ctdb's answer, followed here in spirit, is record migration: a record stays
on the node whose processes last used it and moves only when another node
asks for it. This package is that mechanism; an adapter takes part by
implementing the small protocol in ``protocol.py``.

The parts:

* ``protocol.py``: what an adapter implements (``Ownership``): a node lease,
  taking a record or a bucket of the key space for a node, release requests,
  and fenced write-back.
* ``state.py``: the node agent's state, shared with every process of the
  node through an mmap'd file: the node lease and until when it is surely
  alive, and the keys other nodes are waiting for.
* ``layout.py``: how a record the node owns is kept in the local tdb (a
  header with the owner lease, the fence token and flags), and buckets.
* ``cache.py``: one database's records on the node, for the processes.
* ``sync.py``: a write-back cache's traverse has the other nodes owning
  records of the database write them through first, so it sees them.
* ``agent.py``: the node agent, ``dbwrap-py node-agent`` (one per node, like
  ctdbd): keeps the lease alive, serves release requests, hands deleted
  records back, drains on SIGTERM.

Ownership: a node owns a record while it holds the record's lock in the
store (as a process's record lock would be held, so ownership and process
locks exclude each other), or while it holds the record's bucket and the
record was made there. A bucket is claimed only while it is empty in the
store, so every key in a bucket the node holds was made by the node or
handed to it: a key the node's local copy does not have does not exist,
and a new record costs no round trip.
"""
