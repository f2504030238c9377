"""Throwaway backend servers for tests and ``dbwrap-py check`` (issue 40
moves every one here; ZooKeeper is the first). The helpers they share
(dying_with_parent, stop_process, ...) are in ``dbwrap_py.servers``."""
