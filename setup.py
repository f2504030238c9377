"""Install the dbwrap_py package and its adapters into the project's venv.

The package lives in python/dbwrap_py; the adapters in the top-level adapters/
folder (a package each, or a module for the one-file ones) are installed as
dbwrap_py.adapters, so that a short name such as "tdb" resolves to
dbwrap_py.adapters.tdb. The conformance suite's Python side (the top-level
conformance/: its runner, report, pytest plugin and broken examples) is
installed as dbwrap_py.conformance; its C checks (conformance/checks/), the
linearizability checker and its tests are not Python packages, so they stay
out.
"""

from setuptools import Extension, find_packages, setup

# the C core the extensions and the bridge (c_bridge/) both include, and
# which includes from neither: native_records.h, records_api.h, tdb_api.h,
# the node cache's rules (nodecache_core.[ch], nodecache_layout.h)
CORE = "c_core"

# the tdb adapter's one way into libtdb: TdbFile (one open tdb) and
# TdbRecords (the adapter's record operations, some twenty per SMB2 open
# and close, and the same for the bridge as native records)
tdb = Extension(
    "dbwrap_py.adapters.tdb._tdb",
    sources=["adapters/tdb/_tdb.c", "adapters/tdb/_tdb_file.c", "adapters/tdb/_tdb_record_methods.c",
             "adapters/tdb/_tdb_native.c"],
    include_dirs=[CORE],  # native_records.h (the bridge's C interface), tdb_api.h
    depends=["adapters/tdb/_tdb.h", f"{CORE}/native_records.h", f"{CORE}/tdb_api.h"],
    libraries=["tdb", "talloc"],
)

# the record rules (hold counts, usability), shared by Database and the C bridge
records = Extension(
    "dbwrap_py._records",
    sources=["python/dbwrap_py/_records.c"],
    include_dirs=[CORE],  # records_api.h: the bridge's side of it
    depends=[f"{CORE}/records_api.h"],
)

# the node cache's records in C: its local rules (c_core/nodecache_core.c,
# without Python, linked into libdbwrap_py.so too), and the bridge's hot
# path for owned records (native records, without the GIL)
nodecache_fastpath = Extension(
    "dbwrap_py.nodecache._fastpath",
    sources=["python/dbwrap_py/nodecache/_fastpath.c", f"{CORE}/nodecache_core.c"],
    include_dirs=[CORE],
    depends=[f"{CORE}/{name}" for name in ("native_records.h", "tdb_api.h", "nodecache_core.h",
                                             "nodecache_layout.h")],
    libraries=["tdb", "talloc", "z"],
)

setup(
    name="dbwrap_py",
    version="0.1.0",
    description="Samba dbwrap backends written in Python",
    python_requires=">=3.11",
    # every package under python/, adapters/ and conformance/ (a new one
    # cannot be left out of `make deb`)
    packages=[*find_packages("python"), "dbwrap_py.adapters",
              *(f"dbwrap_py.adapters.{name}" for name in find_packages("adapters")),
              "dbwrap_py.conformance",
              *(f"dbwrap_py.conformance.{name}" for name in find_packages("conformance", exclude=["tests*"]))],
    package_dir={"dbwrap_py": "python/dbwrap_py", "dbwrap_py.adapters": "adapters",
                 "dbwrap_py.conformance": "conformance"},
    ext_modules=[records, tdb, nodecache_fastpath],
    # an adapter's client library, where it is not Debian's (rados): one
    # extra each, since scylla-driver and cassandra-driver install the same
    # package `cassandra` and cannot share a venv. foundationdb is the fdb
    # adapter's binding (imported as fdb); it needs FoundationDB's own
    # libfdb_c at run time, pinned to the same 7.3 client
    extras_require={"cassandra": ["cassandra-driver==3.30.1"], "scylla": ["scylla-driver==3.29.12"],
                    "fdb": ["foundationdb==7.3.63"]},
    entry_points={
        "console_scripts": ["dbwrap-py = dbwrap_py.cli:main"],
        # the conformance checks for an adapter's own CI (conformance_tests())
        "pytest11": ["dbwrap_py_conformance = dbwrap_py.conformance.pytest_plugin"],
        # short names for dbwrap_py:module; a third-party package adds its own
        "dbwrap_py.adapters": [
            f"{name} = dbwrap_py.adapters.{module}:ADAPTER"
            for name, module in (("cassandra", "cassandra"), ("etcd", "etcd"), ("fdb", "fdb"), ("memory", "memory"),
                                 ("rados", "rados"), ("scylla", "cassandra.scylla"), ("sqlite", "sqlite"),
                                 ("sqlite_leased", "sqlite_leased"), ("tdb", "tdb"), ("zookeeper", "zookeeper"))
        ],
        # what tests and benchmarks need of an adapter (a throwaway store, its
        # counters), kept out of the adapter: dbwrap_py.testing.hooks
        "dbwrap_py.testing": [
            f"{name} = dbwrap_py.testing.servers.{module}:HOOKS"
            for name, module in (("cassandra", "cassandra"), ("etcd", "etcd"), ("fdb", "fdb"), ("rados", "rados"),
                                 ("scylla", "cassandra"), ("sqlite_leased", "sqlite_leased"),
                                 ("zookeeper", "zookeeper"))
        ],
    },
)
