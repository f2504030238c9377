"""Proxy mode: smbd's processes load no Python and send every database call
over a unix socket to one daemon per node, which holds the adapters.

``wire`` is the protocol; ``daemon`` the node daemon's socket loop, with
``session`` (and ``traverse``) for one connection's requests, ``shared`` for
the databases connections share and ``locks`` for record exclusion between
connections; ``process`` runs the daemon as a child process; ``client`` is
a small blocking client for tests and ``fuzz`` throws bad input at a daemon.
"""
