"""The cassandra adapter's tables, the CQL of its record tables, and a
volatile database's layout choice.

Tables, in keyspace ``keyspace`` (default ``dbwrap_py``; ``<db>`` is
``DatabaseSpec.cluster_name``):

* ``volatile``: PRIMARY KEY ((db, k)), each record its own partition. Paxos
  runs per partition, so LWTs on different records never contend; a
  database of one partition would put every record lock of locking.tdb in
  one Paxos queue. A secondary index on ``db`` finds a database's records
  for a traverse. ``db`` is ``<db>:<generation>``: a CLEAR_IF_FIRST wipe
  starts a new generation (one LWT) instead of deleting record by record.
* ``persistent``: PRIMARY KEY (db, k), one partition per database, with
  static columns ``txn`` (the transaction lock), ``seq`` and ``commits``.
  A transaction commits as one conditional single-partition batch: Cassandra
  applies it as one Paxos proposal, all or nothing and isolated, and only
  while ``txn`` is still ours. A client that dies mid-commit either sent the
  batch (it is applied, by the coordinator or by the next Paxos round on the
  partition) or did not (nothing is).
* ``databases`` (a volatile database's generation and its open lock),
  ``openers`` (who has it open, rows with a TTL renewed by each opener),
  ``seqnums`` (a counter per volatile database opened with TDB_SEQNUM).

Layouts of a volatile database: ``records`` (table ``volatile`` above) or
``buckets``, the node cache's (``node_volatile``: a partition per bucket, so
that a record's process lock, a node's lock on it and its bucket's claim are
decided by one LWT; ``ownership.py``). A generation's first opener chooses
the layout (option ``layout``, by default ``buckets`` with node_cache, else
``records``), kept in ``databases.layout``; later openers follow it.

``ensure`` makes the keyspace and tables once per process per config (IF NOT
EXISTS), for a database's open and for the node agent, which may come first,
and adds to an older keyspace's tables the columns made since
(``ADDED_COLUMNS``).
"""

from __future__ import annotations

from dbwrap_py.adapters.cassandra import client as cc
from dbwrap_py.errors import ConfigError
from dbwrap_py.nodecache.adapter import node_cache_mode
from dbwrap_py.options import Options

#: a volatile database's layouts: a partition per record, or per bucket (the node cache's)
RECORDS, BUCKETS = "records", "buckets"

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS {ks}.volatile (db text, k blob, v blob, owner text, "token" bigint,
       receipts map<text, bigint>, PRIMARY KEY ((db, k)))""",
    # a traverse reads the database's rows by this index, not the whole table
    "CREATE INDEX IF NOT EXISTS volatile_db ON {ks}.volatile (db)",
    """CREATE TABLE IF NOT EXISTS {ks}.persistent (db text, k blob, v blob, owner text, "token" bigint,
       receipts map<text, bigint>, txn bigint static, txn_owner text static, seq bigint static,
       commits map<text, bigint> static,
       PRIMARY KEY (db, k))""",
    "CREATE TABLE IF NOT EXISTS {ks}.databases (db text PRIMARY KEY, generation bigint, opening bigint, layout text)",
    # the node cache's layout (ownership.py): a bucket's records in one
    # partition, its claim in static columns, so one LWT decides about a record
    """CREATE TABLE IF NOT EXISTS {ks}.node_volatile (db text, bucket int, k blob, v blob, owner text,
       "token" bigint, receipts map<text, bigint>, holder text, held bigint, detached bigint,
       claim bigint static,
       claimer text static, ver bigint static, PRIMARY KEY ((db, bucket), k))""",
    "CREATE INDEX IF NOT EXISTS node_volatile_db ON {ks}.node_volatile (db)",
    "CREATE TABLE IF NOT EXISTS {ks}.nodes (name text PRIMARY KEY, lease bigint)",
    # polled by the owner's agent; deleted once served, so short-lived tombstones;
    # requester: the asking node's "node:lease" (null: a process asked), whom a hand-over gives the record
    """CREATE TABLE IF NOT EXISTS {ks}.requests (node text, db text, k blob, asked bigint, requester text,
       PRIMARY KEY (node, db, k)) WITH gc_grace_seconds = 60""",
    "CREATE TABLE IF NOT EXISTS {ks}.openers (db text, opener bigint, PRIMARY KEY (db, opener))",
    "CREATE TABLE IF NOT EXISTS {ks}.seqnums (db text PRIMARY KEY, n counter)",
)
#: columns added to a table after its first release, (table, column, type):
#: a keyspace made before them gets them on its next open (``ensure``)
ADDED_COLUMNS = (
    ("requests", "requester", "text"),  # whom a hand-over gives the record (ownership.py)
)
_SCHEMA_DONE: set[cc.ClientConfig] = set()


def ensure(config: cc.ClientConfig) -> None:
    """The keyspace and the tables, once per process per config."""
    cc.ensure_schema(config, SCHEMA, _SCHEMA_DONE, ADDED_COLUMNS)


def layout_asked(options: Options) -> str:
    """The layout this opener would choose (option ``layout``: by default
    buckets with the node cache, else records); a generation's first opener
    chooses, later ones follow (``openers.py``)."""
    layout = options.value("layout")
    if layout is None:
        layout = BUCKETS if node_cache_mode(options) else RECORDS
    if layout not in (RECORDS, BUCKETS):
        raise ConfigError(f"layout = {layout!r}: {RECORDS} or {BUCKETS}")
    return layout


def table_of(persistent: bool, layout: str) -> str:
    """The table that holds a database's records."""
    return "persistent" if persistent else "node_volatile" if layout == BUCKETS else "volatile"


#: a TDB_SEQNUM volatile database's counter, counted up by a write and a later opener
BUMP_SEQNUM = "UPDATE {ks}.seqnums SET n = n + 1 WHERE db = ?"


class Statements:
    """The CQL of one table, formatted once. ``buckets``: the node cache's
    layout (table node_volatile, partition (db, bucket)): a take also sets
    ``ver`` (a claim is guarded on it) and is refused while a node holds the
    record (``held``) or its bucket (``claim``, unless the key was detached
    from that very claim): guessed values, as ``v``.

    Record locks (dbwrap_py.leased builds lock, put, unlock on these): the cells
    ``owner`` and ``"token"`` of the record's own row, written with ``USING TTL
    <lease>``, so the server drops a dead holder's lock, not a client clock.

    * take: ``UPDATE ... USING TTL SET owner, "token" IF "token" = null AND v =
      <guess>``: applied, it is the lock and the read in one round trip; the
      guess is the value this process last saw (null for a new record). Not
      applied with the token null, the row it returns holds the value: a second
      try with that guess takes the lock.
    * every locked write: ``UPDATE ... IF owner = ? AND "token" = ?``, so a
      holder whose TTL ran out writes nothing (FencedOut); write+unlock is one
      such statement. In the same conditional batch each leaves a receipt: the
      write's random id in ``receipts[<writer>]``, a cell of the record's row
      with a TTL of its own (cc.RECEIPT_TTL). The writer is this process, which
      holds the lock while it writes: the next holder writes a receipt of its
      own, not over ours.
    * an unknown outcome (``client.py``) is resolved by reading the row
      at SERIAL: the token says whether a take was applied, the receipt whether
      a write was, even once the next holder has written the record since.

    Transactions (table persistent): the lock ``txn`` in the partition's
    static columns, a commit one conditional batch on it with its receipt in
    ``commits``.
    """

    def __init__(self, ks: str, table: str, persistent: bool, old_row: bool, buckets: bool = False) -> None:
        t = f"{ks}.{table}"
        where = "db = ? AND bucket = ? AND k = ?" if buckets else "db = ? AND k = ?"
        free = "txn = null AND " if persistent else ""
        # a server that returns the old row (ScyllaDB) needs no guess of the value
        guess = "" if old_row else " AND v = ?"
        nodes = (" AND held = null AND holder = ? AND claim = ? AND claimer = ? AND detached = ?"
                 if buckets else "")
        ver = ", ver = ?" if buckets else ""
        self.take = (f'UPDATE {t} USING TTL ? SET owner = ?, "token" = ?{ver} WHERE {where} '
                     f'IF {free}"token" = null{nodes}{guess}')
        self.renew = (f'UPDATE {t} USING TTL ? SET owner = ?, "token" = ? WHERE {where} '
                      f'IF owner = ? AND "token" = ?')
        self.write = f'UPDATE {t} SET v = ? WHERE {where} IF owner = ? AND "token" = ?'
        self.write_end = (f'UPDATE {t} SET v = ?, owner = null, "token" = null WHERE {where} '
                          f'IF owner = ? AND "token" = ?')
        self.receipt = f"UPDATE {t} USING TTL {cc.RECEIPT_TTL} SET receipts[?] = ? WHERE {where}"
        self.end = f'UPDATE {t} SET owner = null, "token" = null WHERE {where} IF owner = ? AND "token" = ?'
        self.get = (f"SELECT v, held, claim, detached FROM {t} WHERE {where}" if buckets
                    else f"SELECT v FROM {t} WHERE {where}")
        self.serial = f'SELECT v, "token", receipts FROM {t} WHERE {where}'
        self.scan = f"SELECT k, v FROM {t} WHERE db = ?"  # a partition, or by the index on db
        self.seqnum = (f"SELECT seq FROM {t} WHERE db = ? LIMIT 1" if persistent
                       else f"SELECT n FROM {ks}.seqnums WHERE db = ?")
        self.bump_seqnum = BUMP_SEQNUM.format(ks=ks)
        # a persistent database's transaction (its table only)
        self.txn_take = f"UPDATE {t} USING TTL ? SET txn = ?, txn_owner = ? WHERE db = ? IF txn = null"
        self.txn_renew = f"UPDATE {t} USING TTL ? SET txn = ?, txn_owner = ? WHERE db = ? IF txn = ?"
        self.txn_row = f"SELECT txn, commits, seq FROM {t} WHERE db = ? LIMIT 1"
        self.txn_write = f"UPDATE {t} SET v = ? WHERE db = ? AND k = ?"
        self.txn_commit = f"UPDATE {t} SET txn = null, txn_owner = null, seq = ? WHERE db = ? IF txn = ?"
        self.txn_receipt = f"UPDATE {t} USING TTL {cc.RECEIPT_TTL} SET commits[?] = ? WHERE db = ?"
        self.txn_cancel = f"UPDATE {t} SET txn = null, txn_owner = null WHERE db = ? IF txn = ?"
