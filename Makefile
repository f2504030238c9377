# dbwrap_py: `make` builds everything, `make test` runs every test.
# Both install what they need (Debian packages, the venv) and are idempotent.

PYTHON      ?= /usr/bin/python3
VENV        := .venv
VPY         := $(VENV)/bin/python
# scylla-driver and cassandra-driver install the same package: the scylla dialect's own venv
VENV_SCYLLA := .venv-scylla
VPY_SCYLLA  := $(VENV_SCYLLA)/bin/python
BUILD       := build
# recursive: evaluated in recipes, after deps has installed gcc on a fresh machine
MULTIARCH    = $(shell gcc -print-multiarch)
SAMBA_LIBDIR = /usr/lib/$(MULTIARCH)/samba

# The installed Samba's release, "4.17.12" of "Version 4.17.12-Debian".
# smbd --version prints samba_version_string() of the very Samba the preload
# is loaded into: the string the preload's guard compares at run time
# (c_bridge/version_guard.c). dpkg-query's "2:4.17.12+dfsg-0+deb12u4" and
# the private libraries' symbol version (SAMBA_4.17.12_DEBIAN_SAMBA4) are
# Debian's own spellings of it, which other builds of Samba do not share.
SAMBA_VERSION = $(shell PATH="$$PATH:/usr/sbin" smbd --version 2>/dev/null | \
                  sed -n 's/^Version \([0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
# 4.17.12 -> 41712, for #if in c_bridge/samba_abi.h
SAMBA_VERSION_NUMBER = $(shell echo '$(SAMBA_VERSION)' | \
                         awk -F. '{ printf "%d", $$1 * 10000 + $$2 * 100 + $$3 }')
# Debian 13 renamed the private libraries (libdbwrap-samba4.so.0 became
# libdbwrap-private-samba.so.0): link the one that is installed.
SAMBA_DBWRAP_LIB = $(firstword $(wildcard $(SAMBA_LIBDIR)/libdbwrap-private-samba.so.0 \
                                          $(SAMBA_LIBDIR)/libdbwrap-samba4.so.0))

PY_CFLAGS    = $(shell $(PYTHON)-config --includes)
PY_LDFLAGS   = $(shell $(PYTHON)-config --embed --ldflags)
SAMBA_CFLAGS = $(shell pkg-config --cflags talloc tdb)
SAMBA_LIBS   = $(shell pkg-config --libs talloc tdb)

CFLAGS  ?= -O2 -g
CFLAGS  += -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration \
           -fPIC -std=gnu11 $(SAMBA_CFLAGS) \
           -DDBWRAP_PY_SAMBA_VERSION='"$(SAMBA_VERSION)"' \
           -DDBWRAP_PY_SAMBA_VERSION_NUMBER=$(SAMBA_VERSION_NUMBER)

# The node cache's rules without Python (hidden in the bridge: no ABI).
NODECACHE  := python/dbwrap_py/nodecache
NODECACHE_HDR := $(NODECACHE)/_core.h $(NODECACHE)/_layout.h

# The bridge without Python (what a proxy-mode smbd maps), and the
# in-process transport, the one part linked with libpython, loaded on demand.
BRIDGE_SRC := c_bridge/db_ops.c c_bridge/deferred_store.c c_bridge/buffers.c \
              c_bridge/errno_map.c c_bridge/log.c c_bridge/options.c c_bridge/inproc_loader.c \
              c_bridge/locked_copy.c c_bridge/proxy_wire.c c_bridge/proxy_conn.c \
              c_bridge/transport_proxy.c c_bridge/proxy_fastpath.c c_bridge/nodecache_files.c \
              $(NODECACHE)/_core.c
INPROC_SRC := c_bridge/transport_inproc.c c_bridge/inproc_python.c c_bridge/inproc_native.c \
              c_bridge/py_runtime.c
BRIDGE_HDR := $(wildcard c_bridge/*.h)
BRIDGE_LIB := $(BUILD)/libdbwrap_py.so
INPROC_LIB := $(BUILD)/libdbwrap_py_inproc.so
PRELOAD_LIB := $(BUILD)/libdbwrap_py_preload.so
PRELOAD_SRC := c_bridge/preload.c c_bridge/version_guard.c
# What the build was made for; a change (an upgraded Samba) rebuilds it all.
SAMBA_STAMP := $(BUILD)/samba-version
TEST_BIN   := $(BUILD)/test_dbwrap

CHECK_BIN  := $(BUILD)/dbwrap_check
CHECKER_BIN := $(BUILD)/linearizability
BENCH_BIN  := $(BUILD)/bench_bridge
MICRO_BIN  := $(BUILD)/bench_micro
RESULTS    := results

.PHONY: all deps venv venv-scylla test test-fast test-c test-memcheck test-python test-conformance test-smb test-cluster \
	test-conformance-proxy test-fuzz-proxy test-torture test-torture-matrix test-torture-matrix-full test-torture-scylla \
	test-fresh test-trixie test-trixie-core test-core test-conformance-core test-torture-core \
	test-full bench-fdb-model demo bench bench-bridge bench-smb bench-memory-proxy bench-etcd bench-rados \
	bench-cassandra bench-cluster soak-etcd clean

all: deps venv $(BRIDGE_LIB) $(INPROC_LIB) $(PRELOAD_LIB) $(TEST_BIN) $(CHECK_BIN) $(CHECKER_BIN)

deps:
	@scripts/install-deps.sh

# The package is installed editable, so the bridge always runs the checkout's
# code (and its C extensions, built in place).
venv: $(VENV)/.installed

$(VENV)/.installed: setup.py pyproject.toml tests/requirements.txt $(wildcard adapters/_tdb*.[ch]) \
                   $(wildcard python/dbwrap_py/nodecache/_*.[ch]) \
                   python/dbwrap_py/_records.c c_bridge/native_records.h c_bridge/records_api.h | deps
	@test -x $(VPY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(VPY) -m pip install -q --no-build-isolation -e '.[cassandra,fdb]'
	$(VPY) -m pip install -q -r tests/requirements.txt
	@touch $@

venv-scylla: $(VENV_SCYLLA)/.installed

$(VENV_SCYLLA)/.installed: setup.py pyproject.toml tests/requirements.txt | venv
	@test -x $(VPY_SCYLLA) || $(PYTHON) -m venv --system-site-packages $(VENV_SCYLLA)
	$(VPY_SCYLLA) -m pip install -q --no-build-isolation -e '.[scylla]'
	$(VPY_SCYLLA) -m pip install -q -r tests/requirements.txt
	@touch $@

# Rewritten only when the installed Samba's release or library name changes.
$(SAMBA_STAMP): FORCE | deps
	@mkdir -p $(BUILD)
	@test -n "$(SAMBA_VERSION)" || { echo "smbd --version names no Samba release:" \
		"install samba (scripts/install-deps.sh)" >&2; exit 1; }
	@test -n "$(SAMBA_DBWRAP_LIB)" || { echo "no private dbwrap library" \
		"(libdbwrap-private-samba.so.0 or libdbwrap-samba4.so.0) in $(SAMBA_LIBDIR)" >&2; exit 1; }
	@echo "$(SAMBA_VERSION) $(notdir $(SAMBA_DBWRAP_LIB))" | cmp -s - $@ || \
		echo "$(SAMBA_VERSION) $(notdir $(SAMBA_DBWRAP_LIB))" > $@

$(BRIDGE_LIB): $(BRIDGE_SRC) $(BRIDGE_HDR) $(NODECACHE_HDR) $(SAMBA_STAMP) | deps
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) -Ic_bridge -I$(NODECACHE) -shared -Wl,-soname,libdbwrap_py.so -o $@ \
		$(BRIDGE_SRC) $(SAMBA_LIBS) -lz -ldl -lpthread

# No rpath: only libdbwrap_py.so loads it, so that is in the process already,
# found by its soname however it was loaded
# (and ld.so's $$ORIGIN expansion in dlopen trips valgrind's memcheck).
$(INPROC_LIB): $(INPROC_SRC) $(BRIDGE_HDR) $(BRIDGE_LIB)
	$(CC) $(CFLAGS) $(PY_CFLAGS) -DDBWRAP_PY_PYTHON='"$(PYTHON)"' -shared \
		-o $@ $(INPROC_SRC) -L$(BUILD) -ldbwrap_py $(SAMBA_LIBS) $(PY_LDFLAGS) \
		-ldl -lpthread

# LD_PRELOAD this into smbd: it takes over db_open (from libsmbconf).
# $(1): the library, $(2): where it finds libdbwrap_py.so
link_preload = $(CC) $(CFLAGS) -shared -o $(1) $(PRELOAD_SRC) -L$(BUILD) -ldbwrap_py \
	-l:libsmbconf.so.0 $(SAMBA_LIBS) -ldl -Wl,-rpath,$(2)

$(PRELOAD_LIB): $(PRELOAD_SRC) $(BRIDGE_HDR) $(BRIDGE_LIB) $(INPROC_LIB)
	$(call link_preload,$@,'$$ORIGIN')

# A preload built for another Samba release than the installed one, for the
# version guard's test (tests/smb/test_version_guard.py); build/ is left alone:
#   make preload-claiming CLAIMED_SAMBA_VERSION=4.22.11 CLAIMED_PRELOAD=DIR/libdbwrap_py_preload.so
preload-claiming: SAMBA_VERSION = $(CLAIMED_SAMBA_VERSION)
preload-claiming:
	@test -n "$(CLAIMED_SAMBA_VERSION)" -a -n "$(CLAIMED_PRELOAD)" || { echo "set" \
		"CLAIMED_SAMBA_VERSION and CLAIMED_PRELOAD" >&2; exit 1; }
	@test -f $(BRIDGE_LIB) || { echo "$(BRIDGE_LIB) is missing: run make" >&2; exit 1; }
	$(call link_preload,$(CLAIMED_PRELOAD),$(CURDIR)/$(BUILD))

# Links Samba's real dbwrap front end (a private library) against the bridge.
TEST_SRC := $(wildcard tests/c/*.c)
$(TEST_BIN): $(TEST_SRC) tests/c/harness.h $(BRIDGE_HDR) $(BRIDGE_LIB) $(INPROC_LIB)
	$(CC) $(CFLAGS) $(PY_CFLAGS) -Ic_bridge -o $@ $(TEST_SRC) \
		-L$(BUILD) -ldbwrap_py $(SAMBA_DBWRAP_LIB) \
		-l:libsamba-errors.so.1 $(SAMBA_LIBS) $(PY_LDFLAGS) \
		-Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(SAMBA_LIBDIR)

# The conformance suite's driver: every check through Samba's dbwrap front end.
CHECK_SRC := $(wildcard conformance/*.c)
$(CHECK_BIN): $(CHECK_SRC) conformance/check.h $(BRIDGE_HDR) $(BRIDGE_LIB) $(INPROC_LIB)
	$(CC) $(CFLAGS) -Ic_bridge -o $@ $(CHECK_SRC) \
		-L$(BUILD) -ldbwrap_py $(SAMBA_DBWRAP_LIB) \
		-l:libsamba-errors.so.1 $(SAMBA_LIBS) \
		-Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(SAMBA_LIBDIR)

# Porcupine, pinned in go.sum, checks the histories of the linearizability check.
CHECKER_SRC := $(wildcard conformance/linearizability/*.go) conformance/linearizability/go.mod \
               conformance/linearizability/go.sum
$(CHECKER_BIN): $(CHECKER_SRC) | deps
	@mkdir -p $(BUILD)
	cd conformance/linearizability && go build -buildvcs=false -o $(CURDIR)/$@ .

$(BENCH_BIN): bench/bench_bridge.c $(BRIDGE_HDR) $(BRIDGE_LIB) $(INPROC_LIB)
	$(CC) $(CFLAGS) $(PY_CFLAGS) -Ic_bridge -o $@ $< \
		-L$(BUILD) -ldbwrap_py $(SAMBA_DBWRAP_LIB) \
		$(SAMBA_LIBS) $(PY_LDFLAGS) \
		-Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(SAMBA_LIBDIR)

$(MICRO_BIN): bench/bench_micro.c $(BRIDGE_HDR) $(BRIDGE_LIB) $(INPROC_LIB)
	$(CC) $(CFLAGS) $(PY_CFLAGS) -Ic_bridge -o $@ $< \
		-L$(BUILD) -ldbwrap_py $(SAMBA_DBWRAP_LIB) \
		$(SAMBA_LIBS) $(PY_LDFLAGS) -lm \
		-Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(SAMBA_LIBDIR)

# Everything but the long smbtorture comparisons (what test-fresh runs).
test-fast: all test-c test-memcheck test-python test-conformance test-smb test-fuzz-proxy

test: test-fast test-torture-matrix

# The longer matrix, run before an issue is resolved (CI runs `make test`):
# everything in `make test`, the fresh root, smbtorture on the node-cache
# configurations `make test` leaves out, proxy mode on every adapter, and the
# three-node clusters.
# `make soak-etcd` is separate (~30 min).
test-full: test test-fresh test-trixie test-torture-matrix-full test-torture-scylla test-conformance-proxy \
	test-fuzz-proxy test-cluster

# The two commands on a fresh Debian 12 root (a cached debootstrap minbase, in
# a chroot): `make demo`, then `make test-fast`, on a clone of the committed
# HEAD. Needs root; see scripts/test-fresh.sh.
test-fresh:
	@scripts/test-fresh.sh

# The same on Debian 13 (Samba 4.22, Python 3.13): `make demo`, then `make test`.
test-trixie:
	@FRESH_SUITE=trixie FRESH_TARGETS="demo test" scripts/test-fresh.sh

# CI's part of it (test-trixie does not fit beside make test in CI's time):
# `make demo`, then `make test-core` on Debian 13.
test-trixie-core:
	@FRESH_SUITE=trixie FRESH_TARGETS="demo test-core" scripts/test-fresh.sh

# The core of make test: the C suite, pytest, conformance for tdb and etcd,
# and smbtorture through bridge+tdb and bridge+etcd against native.
test-core: test-c test-python test-conformance-core test-torture-core

test-conformance-core: all
	$(VPY) -m dbwrap_py.cli check tdb
	$(VPY) -m dbwrap_py.cli check etcd -o lease_ttl=2

test-torture-core: all
	$(VPY) -m dbwrap_py.cli torture --parallel 4 --config tdb --config etcd

# bridge+proxy: the tdb adapter in a throwaway node daemon
test-c: all
	DBWRAP_PY_PATH=$(CURDIR)/tests/fixtures $(VPY) -m dbwrap_py.proxy.around $(TEST_BIN)

# The C suite and the do_locked value check under valgrind memcheck.
test-memcheck: all
	@scripts/memcheck.sh

test-python: venv venv-scylla $(BRIDGE_LIB) $(INPROC_LIB)
	$(VPY) -m pytest -q tests/python
	$(VPY_SCYLLA) -m pytest -q tests/python/test_scylla_dialect.py

# The adapter conformance suite: the tables for tdb, memory, etcd (on a
# throwaway etcd, 2 s leases to keep it short) and rados (on a throwaway
# one-OSD Ceph, 2 s record locks), cassandra (on a throwaway one-node
# Cassandra, 2 s record locks), then the other adapters and
# every broken example under pytest. etcd, rados and cassandra run twice: without and
# with the node cache (a throwaway node agent beside the throwaway store);
# sqlite_leased with the node cache too (a throwaway agent on a temporary
# cluster file; without it, it runs under pytest). fdb runs on a throwaway
# model of FoundationDB (no FoundationDB can run here), without and with the
# node cache: its tables say fdb (model).
test-conformance: all venv-scylla
	$(VPY) -m dbwrap_py.cli check tdb
	$(VPY) -m dbwrap_py.cli check memory
	$(VPY) -m dbwrap_py.cli check etcd -o lease_ttl=2
	$(VPY) -m dbwrap_py.cli check etcd -o lease_ttl=2 -o node_cache=yes
	$(VPY) -m dbwrap_py.cli check sqlite_leased -o node_cache=yes
	$(VPY) -m dbwrap_py.cli check rados -o lease=2
	$(VPY) -m dbwrap_py.cli check rados -o lease=2 -o node_cache=yes
	$(VPY) -m dbwrap_py.cli check cassandra -o lease=2
	$(VPY) -m dbwrap_py.cli check cassandra -o lease=2 -o node_cache=yes
	$(VPY_SCYLLA) -m dbwrap_py.cli check scylla -o lease=2
	$(VPY) -m dbwrap_py.cli check fdb -o fdb_library=model
	$(VPY) -m dbwrap_py.cli check fdb -o fdb_library=model -o node_cache=yes
	$(VPY) -m dbwrap_py.cli check tdb -o transport=proxy
	$(VPY) -m dbwrap_py.cli check sqlite_leased -o transport=proxy -o node_cache=yes
	$(VPY) -m pytest -q tests/conformance

# The same tables in proxy mode (each run starts a throwaway node daemon):
# every adapter that can run here, with and without the node cache, and with
# the node cache both ways: smbd reaching it itself (proxy_fastpath, the
# default) and every call through the daemon (proxy_fastpath=no).
test-conformance-proxy: all
	$(VPY) -m dbwrap_py.cli check sqlite_leased -o transport=proxy
	$(VPY) -m dbwrap_py.cli check sqlite_leased -o transport=proxy -o node_cache=yes -o proxy_fastpath=no
	$(VPY) -m dbwrap_py.cli check etcd -o transport=proxy -o lease_ttl=2
	$(VPY) -m dbwrap_py.cli check etcd -o transport=proxy -o lease_ttl=2 -o node_cache=yes -o proxy_fastpath=no
	$(VPY) -m dbwrap_py.cli check etcd -o transport=proxy -o lease_ttl=2 -o node_cache=yes
	$(VPY) -m dbwrap_py.cli check rados -o transport=proxy -o lease=2
	$(VPY) -m dbwrap_py.cli check rados -o transport=proxy -o lease=2 -o node_cache=yes -o proxy_fastpath=no
	$(VPY) -m dbwrap_py.cli check rados -o transport=proxy -o lease=2 -o node_cache=yes
	$(VPY) -m dbwrap_py.cli check cassandra -o transport=proxy -o lease=2
	$(VPY) -m dbwrap_py.cli check cassandra -o transport=proxy -o lease=2 -o node_cache=yes -o proxy_fastpath=no
	$(VPY) -m dbwrap_py.cli check cassandra -o transport=proxy -o lease=2 -o node_cache=yes
	$(VPY) -m dbwrap_py.cli check fdb -o transport=proxy -o fdb_library=model
	$(VPY) -m dbwrap_py.cli check fdb -o transport=proxy -o fdb_library=model -o node_cache=yes -o proxy_fastpath=no
	$(VPY) -m dbwrap_py.cli check fdb -o transport=proxy -o fdb_library=model -o node_cache=yes

# Three-node Samba clusters (ctdb; etcd, rados, cassandra and the fdb model,
# each without and with the node cache; and a broken one the checks must
# fail on): clients on different nodes (make test-full).
test-cluster: all
	$(VPY) -m pytest -q tests/cluster

# The installed smbd and Samba tools on the bridge (needs root, as smbd does).
test-smb: all
	$(VPY) -m pytest -q tests/smb

# smbtorture's smb2 suites on `make test`'s bridge configurations, each
# against one native run of every suite, four smbtorture runs at a time (the
# runs mostly wait on smbd's timers): tdb, etcd without and with the node
# cache, rados, cassandra, the model of FoundationDB (not FoundationDB, which
# cannot run here), and tdb in proxy mode. Each starts its throwaway server.
TORTURE_CONFIGS := tdb etcd etcd,node_cache=yes rados cassandra fdb,fdb_library=model tdb,transport=proxy
test-torture-matrix: all
	$(VPY) -m dbwrap_py.cli torture --parallel 4 $(addprefix --config ,$(TORTURE_CONFIGS))

# The node-cache and proxy configurations `make test` leaves out (make test-full).
TORTURE_CONFIGS_FULL := etcd,node_cache=write-through sqlite_leased,node_cache=yes rados,node_cache=yes \
	cassandra,node_cache=yes fdb,fdb_library=model,node_cache=yes etcd,transport=proxy \
	rados,transport=proxy etcd,transport=proxy,node_cache=yes
test-torture-matrix-full: all
	$(VPY) -m dbwrap_py.cli torture --parallel 4 $(addprefix --config ,$(TORTURE_CONFIGS_FULL))

# One configuration against native tdb, side by side, e.g.
# make test-torture TORTURE_CONFIG=etcd,node_cache=yes (default: tdb).
TORTURE_CONFIG ?= tdb
test-torture: all
	$(VPY) -m dbwrap_py.cli torture --config $(TORTURE_CONFIG)

# Random, truncated and mutated requests at a throwaway node daemon for 30 s:
# it must stay up, with no record left locked.
test-fuzz-proxy: all
	$(VPY) -m dbwrap_py.proxy.fuzz 30

# The scylla dialect (scylla-driver, its own venv) against the same throwaway
# Cassandra: no ScyllaDB server can be had here.
test-torture-scylla: all venv-scylla
	$(VPY_SCYLLA) -m dbwrap_py.cli torture --adapter scylla

# The main job: a real smbd on the bridge, opens/s against native tdb.
demo: all
	@$(VPY) -m dbwrap_py.cli demo

# Measures only; never part of `make test`.
bench-bridge: all $(BENCH_BIN)
	@mkdir -p $(RESULTS)
	$(BENCH_BIN) 20000 $(RESULTS)/bench-bridge.json
	$(VPY) -m dbwrap_py.cli bench instructions --json $(RESULTS)/bench-instructions.json

# Every landed adapter against native tdb: SMB sweep, micro, memory (~10 min).
bench: all $(MICRO_BIN)
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench smb --nprocs 1,2,4,8,16,32,64,128 --time 8 \
		--json $(RESULTS)/bench-smb.json
	$(VPY) -m dbwrap_py.cli bench micro --time 1 --json $(RESULTS)/bench-micro.json
	$(VPY) -m dbwrap_py.cli bench memory --connections 1,16,64 \
		--json $(RESULTS)/bench-memory.json

# bridge+tdb in process and through the node daemon (proxy mode) against
# native tdb, three paired rounds per point.
bench-smb: all
	$(VPY) -m dbwrap_py.cli bench smb --adapters tdb --transports inproc,proxy --nprocs 1,4,16,64 \
		--time 8 --rounds 3 --json $(RESULTS)/bench-smb-tdb.json

# Memory per smbd client process in process and in proxy mode, against
# native, at 1 to 256 connections, for etcd, rados and cassandra (throwaway
# servers); the node daemon's own memory is reported apart.
bench-memory-proxy: all
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench memory --adapters etcd,rados,cassandra --transports inproc,proxy \
		--connections 1,16,64,256 --json $(RESULTS)/bench-memory-proxy.json

# etcd with the node cache (a throwaway etcd and node agent) against native
# tdb, three paired rounds per point: all eight volatile databases
# write-back; the seed's configuration (smbXsrv_open_global node-local, on
# native tdb); smbXsrv_open_global write-through (what a durable handle's
# reconnect on another node needs), the rest write-back. The first also
# through the node daemon (proxy mode). Then its memory per smbd process.
bench-etcd: all
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench smb --adapters etcd -o etcd:node_cache=yes \
		--transports inproc,proxy,proxy-fastpath --nprocs 1,4,16,64 --time 8 --rounds 3 \
		--json $(RESULTS)/bench-smb-etcd-node-cache.json
	$(VPY) -m dbwrap_py.cli bench smb --adapters etcd -o etcd:node_cache=yes --nprocs 1,4,16,64 \
		--time 8 --rounds 3 --local smbXsrv_open_global.tdb \
		--json $(RESULTS)/bench-smb-etcd-node-cache-seed.json
	$(VPY) -m dbwrap_py.cli bench smb --adapters etcd -o etcd:node_cache=yes \
		-o etcd:smbXsrv_open_global.tdb:node_cache=write-through --nprocs 1,4,16,64 \
		--time 8 --rounds 3 --json $(RESULTS)/bench-smb-etcd-write-through.json
	$(VPY) -m dbwrap_py.cli bench memory --adapters etcd -o etcd:node_cache=yes \
		--transports inproc,proxy,proxy-fastpath --connections 1,16,64 \
		--json $(RESULTS)/bench-memory-etcd-node-cache.json

# rados (a throwaway one-OSD Ceph) against native tdb, two paired rounds
# per point, at three omap ratios: 1, 8 (the default) and 64 objects per
# volatile database; then its memory and threads per smbd process; then
# the node cache (opens/s), and round trips per dbwrap operation (bench
# micro) without and with it.
bench-rados: all $(MICRO_BIN)
	@mkdir -p $(RESULTS)
	for objects in 1 8 64; do \
		$(VPY) -m dbwrap_py.cli bench smb --adapters rados -o rados:objects=$$objects \
			--nprocs 1,4,16,64 --time 8 --rounds 2 \
			--json $(RESULTS)/bench-smb-rados-objects-$$objects.json || exit 1; \
	done
	$(VPY) -m dbwrap_py.cli bench memory --adapters rados --connections 1,16,64 \
		--json $(RESULTS)/bench-memory-rados.json
	$(VPY) -m dbwrap_py.cli bench smb --adapters rados -o rados:node_cache=yes \
		--nprocs 1,4,16,64 --time 8 --rounds 2 --json $(RESULTS)/bench-smb-rados-cache.json
	$(VPY) -m dbwrap_py.cli bench micro --adapters rados --time 1 \
		--json $(RESULTS)/bench-micro-rados.json
	$(VPY) -m dbwrap_py.cli bench micro --adapters rados -o rados:node_cache=yes --time 1 \
		--json $(RESULTS)/bench-micro-rados-cache.json

# cassandra (a throwaway one-node Cassandra) against native tdb, two paired
# rounds per point, without and with the node cache; its memory and threads per smbd process; round trips
# per dbwrap operation (bench micro). The consistency options and
# paxos_variant, and LWTs under contention, are bench/cassandra_*.py.
bench-cassandra: all $(MICRO_BIN)
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench smb --adapters cassandra --nprocs 1,4,16,64 --time 8 --rounds 2 \
		--json $(RESULTS)/bench-smb-cassandra.json
	$(VPY) -m dbwrap_py.cli bench smb --adapters cassandra -o cassandra:node_cache=yes --nprocs 1,4,16,64 \
		--time 8 --rounds 2 --json $(RESULTS)/bench-smb-cassandra-cache.json
	$(VPY) -m dbwrap_py.cli bench memory --adapters cassandra --connections 1,16,64 \
		--json $(RESULTS)/bench-memory-cassandra.json
	$(VPY) -m dbwrap_py.cli bench micro --adapters cassandra --time 1 \
		--json $(RESULTS)/bench-micro-cassandra.json

# fdb on the model of FoundationDB (a throwaway model server), labelled
# "fdb (model)": its figures are the model's, never FoundationDB's. Against
# native tdb, two paired rounds per point, without and with the node cache;
# memory and threads per smbd process; round trips per dbwrap operation.
bench-fdb-model: all $(MICRO_BIN)
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench smb --adapters fdb -o fdb:fdb_library=model --nprocs 1,4,16,64 \
		--time 8 --rounds 2 --json $(RESULTS)/bench-smb-fdb-model.json
	$(VPY) -m dbwrap_py.cli bench smb --adapters fdb -o fdb:fdb_library=model -o fdb:node_cache=yes \
		--nprocs 1,4,16,64 --time 8 --rounds 2 --json $(RESULTS)/bench-smb-fdb-model-cache.json
	$(VPY) -m dbwrap_py.cli bench memory --adapters fdb -o fdb:fdb_library=model --connections 1,16,64 \
		--json $(RESULTS)/bench-memory-fdb-model.json
	$(VPY) -m dbwrap_py.cli bench micro --adapters fdb -o fdb:fdb_library=model --time 1 \
		--json $(RESULTS)/bench-micro-fdb-model.json

# A three-node Samba cluster on this host (ctdbd and smbd per node):
# path-contention-shared with the clients spread over the nodes (--unclist),
# 1 to 512 clients, ctdb against etcd, rados, cassandra and fdb (model), each
# without and with the node cache; one cluster at a time, fresh each round,
# two rounds in alternating order; ratios to ctdb per round. ~35 min here.
bench-cluster: all
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench cluster --nprocs 1,2,4,8,16,32,64,128,256,512 --time 5 \
		--rounds 2 --json $(RESULTS)/bench-cluster.json

# 500 path-contention points on etcd with the node cache (1 and 16 connections
# in turn, one long-lived smbd and node agent); stops at the first failed
# point and prints what explains it. Not part of make test.
soak-etcd: all
	$(VPY) -m dbwrap_py.cli soak --adapter etcd --points 500 --nprocs 1,16 --time 3

clean:
	rm -rf $(BUILD)

FORCE:
