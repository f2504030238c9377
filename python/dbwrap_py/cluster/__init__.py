"""A Samba cluster on one host: ctdb for messaging, volatile databases from
ctdb or an adapter (samba_cluster.py), its ctdbds (ctdb.py)."""
