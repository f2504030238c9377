"""For tests only: stand-ins for backends that cannot run on this machine,
an SMB client, and adapters broken on purpose for the tests that must fail
on them.

Everything here is labelled as what it is: ``fdb_model`` is a model of
FoundationDB's transaction semantics, not FoundationDB. ``smb_client``
needs smbprotocol (tests/requirements.txt). ``skips_write_through`` loses
persistent records with their node (tests/cluster).
"""
