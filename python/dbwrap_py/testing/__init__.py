"""For tests only: stand-ins for backends that cannot run on this machine,
and an SMB client.

Everything here is labelled as what it is: ``fdb_model`` is a model of
FoundationDB's transaction semantics, not FoundationDB. ``smb_client``
needs smbprotocol (tests/requirements.txt).
"""
