"""Count the internode round trips of one LWT write, paxos_variant v1 against v2.

Cassandra's cassandra.yaml comments expect four round trips per LWT write
with v1 (prepare, read, propose, commit) and two with v2. This counts them:
a throwaway three-node cluster (RF 3) per variant, the adapter's take
statement run with CQL tracing, and the distinct request verbs the
coordinator sent to replicas read from the trace. A measurement, not a test:

    .venv/bin/python bench/cassandra_paxos_rounds.py
"""

from __future__ import annotations

import re
import secrets
import sys
import time

from cassandra.cluster import Cluster

from dbwrap_py.testing.servers.cassandra import CassandraCluster

#: "Sending PAXOS2_PREPARE_REQ message to /127.0.0.2:7000 ..."
SENT = re.compile(r"Sending (\w+?)_REQ message to")


def rounds(variant: str, statements: int = 5) -> list[list[str]]:
    """The request verbs sent per traced LWT, in order, for ``statements`` takes."""
    found = []
    with CassandraCluster(nodes=3, paxos_variant=variant) as cluster:
        hosts = [p.split(":")[0] for p in cluster.contact_points.split(",")]
        port = int(cluster.contact_points.split(",")[0].split(":")[1])
        driver = Cluster(hosts, port=port, protocol_version=5)
        session = driver.connect()
        session.execute("CREATE KEYSPACE IF NOT EXISTS paxos_rounds WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        session.execute('CREATE TABLE IF NOT EXISTS paxos_rounds.t (k blob PRIMARY KEY, v blob, "token" bigint)')
        take = session.prepare('UPDATE paxos_rounds.t USING TTL 10 SET "token" = ? WHERE k = ? IF "token" = null')
        time.sleep(2)  # schema settled on every node
        for _ in range(statements):
            result = session.execute(take, (secrets.randbits(62), secrets.token_bytes(8)), trace=True)
            time.sleep(0.5)  # the replicas' trace events arrive after the result
            events = result.get_query_trace(max_wait_sec=10).events
            verbs = []
            for event in sorted(events, key=lambda e: e.datetime):
                match = SENT.search(event.description)
                if match and (not verbs or verbs[-1] != match.group(1)):
                    verbs.append(match.group(1))
            found.append(verbs)
        driver.shutdown()
    return found


def main() -> int:
    for variant in ("v1", "v2"):
        per_statement = [v for v in rounds(variant) if v]  # a trace read too early shows no events
        counts = sorted(len(v) for v in per_statement)
        print(f"paxos_variant {variant}: round trips per LWT write {counts} "
              f"(median {counts[len(counts) // 2] if counts else '?'})")
        for verbs in sorted({tuple(v) for v in per_statement}):
            print(f"  {' -> '.join(verbs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
