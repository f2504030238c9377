"""Stand-ins for backends that cannot run on this machine, for tests only.

Everything here is labelled as what it is: ``fdb_model`` is a model of
FoundationDB's transaction semantics, not FoundationDB.
"""
