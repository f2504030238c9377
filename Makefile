# dbwrap_py: `make` builds everything, `make test` runs every test, `make
# check` is the quick inner loop, `make help` lists every target.
# Each installs what it needs (Debian packages, the venv) and is idempotent.
#
# `make help` prints the lines that start with "##@ " (a group) and the
# targets whose line ends in "## what it does".

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

# The throwaway JVM servers' JIT (dbwrap_py.servers.jvm_jit_flags): tests
# compile with C1 only, half a Cassandra start's CPU; benchmarks and soaks
# keep the full JIT, whose steady state they measure.
export DBWRAP_PY_SERVER_JIT ?= quick
bench bench-% soak-%: export DBWRAP_PY_SERVER_JIT = full

PY_CFLAGS    = $(shell $(PYTHON)-config --includes)
PY_LDFLAGS   = $(shell $(PYTHON)-config --embed --ldflags)
SAMBA_CFLAGS = $(shell pkg-config --cflags talloc tdb)
SAMBA_LIBS   = $(shell pkg-config --libs talloc tdb)

CFLAGS  ?= -O2 -g
# as given (dpkg-buildflags' for the package), before what the build adds
CFLAGS_GIVEN := $(CFLAGS)
CFLAGS  += -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration \
           -fPIC -std=gnu11 $(SAMBA_CFLAGS) \
           -DDBWRAP_PY_SAMBA_VERSION='"$(SAMBA_VERSION)"' \
           -DDBWRAP_PY_SAMBA_VERSION_NUMBER=$(SAMBA_VERSION_NUMBER)

# The C core both sides include, and which includes neither: the native
# records and record rules interfaces, the tdb adapter's capsule, and the
# node cache's rules without Python (hidden in the bridge: no ABI). The
# bridge links CORE_SRC; setup.py builds it into the Python extensions.
CORE     := c_core
CORE_HDR := $(wildcard $(CORE)/*.h)
CORE_SRC := $(CORE)/nodecache_core.c

# The bridge without Python (what a proxy-mode smbd maps), and the
# in-process transport, the one part linked with libpython, loaded on demand.
BRIDGE_SRC := c_bridge/db_ops.c c_bridge/deferred_store.c c_bridge/buffers.c \
              c_bridge/errno_map.c c_bridge/log.c c_bridge/options.c c_bridge/inproc_loader.c \
              c_bridge/locked_copy.c c_bridge/proxy_wire.c c_bridge/proxy_conn.c \
              c_bridge/transport_proxy.c c_bridge/proxy_fastpath.c c_bridge/nodecache_files.c \
              c_bridge/per_rec_persistent.c \
              $(CORE_SRC)
INPROC_SRC := c_bridge/transport_inproc.c c_bridge/inproc_python.c c_bridge/inproc_native.c \
              c_bridge/py_runtime.c
BRIDGE_HDR := $(wildcard c_bridge/*.h) $(CORE_HDR)
BRIDGE_LIB := $(BUILD)/libdbwrap_py.so
INPROC_LIB := $(BUILD)/libdbwrap_py_inproc.so
PRELOAD_LIB := $(BUILD)/libdbwrap_py_preload.so
PRELOAD_SRC := c_bridge/preload.c c_bridge/version_guard.c
# What the build was made for; a change (an upgraded Samba) rebuilds it all.
SAMBA_STAMP := $(BUILD)/samba-version
TEST_BIN   := $(BUILD)/test_dbwrap
# the proxy client with sanitizers, and its broken twin (below)
PROXY_CLIENT_SRC := tests/proxy_client/proxy_client.c c_bridge/proxy_wire.c c_bridge/proxy_conn.c \
                    c_bridge/transport_proxy.c c_bridge/proxy_fastpath.c c_bridge/nodecache_files.c \
                    c_bridge/locked_copy.c c_bridge/log.c c_bridge/options.c $(CORE_SRC)
PROXY_CLIENT_BIN := $(BUILD)/proxy_client
PROXY_CLIENT_BROKEN := $(BUILD)/proxy_client_broken
PROXY_CLIENTS := $(PROXY_CLIENT_BIN) $(PROXY_CLIENT_BROKEN)

CHECK_BIN  := $(BUILD)/dbwrap_check
CHECKER_BIN := $(BUILD)/linearizability
BENCH_BIN  := $(BUILD)/bench_bridge
MICRO_BIN  := $(BUILD)/bench_micro
# make bench-elastic's SMB client: opens/s in bins of any width
OPEN_LOOP_BIN := $(BUILD)/smb_open_loop
# recursive: evaluated in the recipe, after deps has installed libsmbclient-dev
SMBCLIENT_CFLAGS = $(shell pkg-config --cflags smbclient)
SMBCLIENT_LIBS   = $(shell pkg-config --libs smbclient)
RESULTS    := results
# What the C build depends on first; the package's build (make package-build)
# empties it: dpkg-buildpackage has checked the Build-Depends already.
DEPS       := deps
# Where the preload finds libdbwrap_py.so: beside it (the package: its own folder)
PRELOAD_RPATH := '$$ORIGIN'
# -DDBWRAP_PY_INSTALLED for the package: no venv or module path from the
# environment or a checkout (c_bridge/py_runtime.c)
INSTALLED_CFLAGS :=

.PHONY: help all deps venv venv-scylla clean check samba-abi-check samba-abi-offsets test test-fast test-c test-memcheck test-python \
	test-python-unit test-python-full test-conformance test-conformance-tdb test-conformance-scylla test-conformance-servers test-smb test-cluster \
	test-conformance-proxy test-fuzz-proxy test-torture test-torture-matrix test-torture-matrix-full \
	test-torture-matrix-long test-torture-persistent \
	test-torture-scylla test-fresh test-trixie test-trixie-core test-sid test-sid-core test-core test-conformance-core \
	test-torture-core test-full bench-fdb-model demo bench bench-ca bench-ca-cluster bench-bridge bench-smb bench-memory-proxy \
	bench-etcd bench-rados bench-cassandra bench-zookeeper bench-cluster bench-elastic soak-etcd server-etcd server-ceph \
	server-cassandra server-zookeeper server-samba test-setup test-python-servers test-conformance-local \
	test-conformance-etcd test-conformance-rados test-conformance-cassandra test-conformance-fdb test-conformance-zookeeper \
	preload-claiming test-cluster-torture-failover test-sid-torture-failover \
	deb test-deb package-build package-install

.DEFAULT_GOAL := all

help: ## every target, one line each, by group
	@awk '/^##@ / { printf "\n%s\n", substr($$0, 5) } \
	      /^[a-z][a-z0-9-]*:.*## / { split($$0, t, ":"); sub(/.*## /, ""); printf "  %-26s %s\n", t[1], $$0 }' \
	    $(MAKEFILE_LIST)

##@ Set-up (each is idempotent; every other target runs what it needs of them)
clean: ## remove build/
	rm -rf $(BUILD)

all: deps venv $(BRIDGE_LIB) $(INPROC_LIB) $(PRELOAD_LIB) $(TEST_BIN) $(CHECK_BIN) $(CHECKER_BIN) $(PROXY_CLIENTS) ## build the bridge, the preload, the C tests and the venv

deps: ## install the Debian packages that are missing (scripts/install-deps.sh)
	@scripts/install-deps.sh

# The package is installed editable, so the bridge always runs the checkout's
# code (and its C extensions, built in place).
venv: $(VENV)/.installed ## the .venv with dbwrap_py installed editable

$(VENV)/.installed: setup.py pyproject.toml tests/requirements.txt $(wildcard adapters/tdb/_tdb*.[ch]) \
                   $(wildcard python/dbwrap_py/nodecache/_*.c) python/dbwrap_py/_records.c \
                   $(CORE_HDR) $(CORE_SRC) | deps
	@test -x $(VPY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(VPY) -m pip install -q --no-build-isolation -e '.[cassandra,fdb]'
	$(VPY) -m pip install -q -r tests/requirements.txt
	@touch $@

venv-scylla: $(VENV_SCYLLA)/.installed ## the scylla dialect's own venv (scylla-driver)

$(VENV_SCYLLA)/.installed: setup.py pyproject.toml tests/requirements.txt | venv
	@test -x $(VPY_SCYLLA) || $(PYTHON) -m venv --system-site-packages $(VENV_SCYLLA)
	$(VPY_SCYLLA) -m pip install -q --no-build-isolation -e '.[scylla]'
	$(VPY_SCYLLA) -m pip install -q -r tests/requirements.txt
	@touch $@

# Rewritten only when the installed Samba's release or library name changes.
$(SAMBA_STAMP): FORCE | $(DEPS)
	@mkdir -p $(BUILD)
	@test -n "$(SAMBA_VERSION)" || { echo "smbd --version names no Samba release:" \
		"install samba (scripts/install-deps.sh)" >&2; exit 1; }
	@test -n "$(SAMBA_DBWRAP_LIB)" || { echo "no private dbwrap library" \
		"(libdbwrap-private-samba.so.0 or libdbwrap-samba4.so.0) in $(SAMBA_LIBDIR)" >&2; exit 1; }
	@$(MAKE) -s samba-abi-check
	@echo "$(SAMBA_VERSION) $(notdir $(SAMBA_DBWRAP_LIB))" | cmp -s - $@ || \
		echo "$(SAMBA_VERSION) $(notdir $(SAMBA_DBWRAP_LIB))" > $@

# Is SAMBA_VERSION in c_bridge/samba_abi.h's table of checked releases? An
# unchecked one stops the build here (never a guessed layout: smbd panics).
samba-abi-check: ## fail unless samba_abi.h was checked against SAMBA_VERSION (default: the installed one)
	@printf '#include "samba_abi.h"\n' | $(CC) $(CFLAGS) -Ic_bridge -fsyntax-only -x c - 2>/dev/null || { \
		echo "Samba $(SAMBA_VERSION) is not a release c_bridge/samba_abi.h was checked against" \
		"(its table: 4.17.12 to 4.24.x, 4.25.1). Compare that release's" \
		"lib/dbwrap/dbwrap_private.h and source3/lib/dbwrap/dbwrap_open.h with samba_abi.h," \
		"run scripts/samba-abi-probe.sh on its samba-libs, then add it to the table." >&2; exit 1; }

# What samba_abi.h says the fields' offsets are, as scripts/samba-abi-probe.sh prints them.
samba-abi-offsets: $(SAMBA_STAMP) ## the offsets samba_abi.h declares (compare: scripts/samba-abi-probe.sh)
	@$(CC) $(CFLAGS) -Ic_bridge -o $(BUILD)/samba_abi_offsets tests/abi/samba_abi_offsets.c
	@$(BUILD)/samba_abi_offsets

$(BRIDGE_LIB): $(BRIDGE_SRC) $(BRIDGE_HDR) $(SAMBA_STAMP) | $(DEPS)
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(LDFLAGS) -Ic_bridge -I$(CORE) -shared -Wl,-soname,libdbwrap_py.so -o $@ \
		$(BRIDGE_SRC) $(SAMBA_LIBS) -lz -ldl -lpthread

# No rpath: only libdbwrap_py.so loads it, so that is in the process already,
# found by its soname however it was loaded
# (and ld.so's $$ORIGIN expansion in dlopen trips valgrind's memcheck).
$(INPROC_LIB): $(INPROC_SRC) $(BRIDGE_HDR) $(BRIDGE_LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) $(PY_CFLAGS) -I$(CORE) -DDBWRAP_PY_PYTHON='"$(PYTHON)"' $(INSTALLED_CFLAGS) -shared \
		-o $@ $(INPROC_SRC) -L$(BUILD) -ldbwrap_py $(SAMBA_LIBS) $(PY_LDFLAGS) \
		-ldl -lpthread

# LD_PRELOAD this into smbd: it takes over db_open (from libsmbconf).
# $(1): the library, $(2): where it finds libdbwrap_py.so
link_preload = $(CC) $(CFLAGS) $(LDFLAGS) -shared -o $(1) $(PRELOAD_SRC) -L$(BUILD) -ldbwrap_py \
	-l:libsmbconf.so.0 $(SAMBA_LIBS) -ldl -Wl,-rpath,$(2)

$(PRELOAD_LIB): $(PRELOAD_SRC) $(BRIDGE_HDR) $(BRIDGE_LIB) $(INPROC_LIB)
	$(call link_preload,$@,$(PRELOAD_RPATH))

# A preload built for another Samba release than the installed one, for the
# version guard's test (tests/smb/test_version_guard.py); build/ is left alone:
#   make preload-claiming CLAIMED_SAMBA_VERSION=4.22.11 CLAIMED_PRELOAD=DIR/libdbwrap_py_preload.so
preload-claiming: SAMBA_VERSION = $(CLAIMED_SAMBA_VERSION)
preload-claiming: ## a preload built for CLAIMED_SAMBA_VERSION (the version guard's test)
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

# The proxy transport's client (transport_proxy.c and what it calls) in a
# driver of its own, with AddressSanitizer and UBSan, for a fake node daemon
# on the other end: tests/python/test_proxy_client.py and the client fuzzer
# (dbwrap_py.proxy.fuzz_client). The broken twin takes any max_message a
# HELLO advertises (DBWRAP_PY_BROKEN_MAX_MESSAGE): the fuzzer's broken example.
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
# $(1): the driver, $(2): more flags
link_proxy_client = $(CC) $(CFLAGS) $(SANITIZE) $(2) -Ic_bridge -I$(CORE) -o $(1) \
	$(PROXY_CLIENT_SRC) -l:libsamba-errors.so.1 $(SAMBA_LIBS) -lz -ldl -lpthread \
	-Wl,-rpath,$(SAMBA_LIBDIR)

$(PROXY_CLIENT_BIN): $(PROXY_CLIENT_SRC) $(BRIDGE_HDR) $(SAMBA_STAMP) | deps
	$(call link_proxy_client,$@,)

$(PROXY_CLIENT_BROKEN): $(PROXY_CLIENT_SRC) $(BRIDGE_HDR) $(SAMBA_STAMP) | deps
	$(call link_proxy_client,$@,-DDBWRAP_PY_BROKEN_MAX_MESSAGE)

# The conformance suite's driver: every check through Samba's dbwrap front end.
CHECK_SRC := $(wildcard conformance/checks/*.c)
$(CHECK_BIN): $(CHECK_SRC) conformance/checks/check.h $(BRIDGE_HDR) $(BRIDGE_LIB) $(INPROC_LIB)
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

# On libsmbclient only (no bridge): bench-elastic builds it, not all.
$(OPEN_LOOP_BIN): bench/smb_open_loop.c | $(DEPS)
	@pkg-config --exists smbclient || { echo "pkg-config knows no smbclient:" \
		"libsmbclient-dev is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) $(SMBCLIENT_CFLAGS) -o $@ $< $(SMBCLIENT_LIBS)

$(MICRO_BIN): bench/bench_micro.c $(BRIDGE_HDR) $(BRIDGE_LIB) $(INPROC_LIB)
	$(CC) $(CFLAGS) $(PY_CFLAGS) -Ic_bridge -o $@ $< \
		-L$(BUILD) -ldbwrap_py $(SAMBA_DBWRAP_LIB) \
		$(SAMBA_LIBS) $(PY_LDFLAGS) -lm \
		-Wl,-rpath,'$$ORIGIN' -Wl,-rpath,$(SAMBA_LIBDIR)

##@ Tests (which to run after which change: docs/tests.md)
# pytest workers (pytest-xdist): the tests mostly wait on leases, timeouts
# and servers. A file runs on one worker, and every test that runs a
# Cassandra on one worker; the controller starts one etcd and one Ceph for
# every worker (tests/python/conftest.py).
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadgroup --durations=12
# smbtorture runs at a time in the matrix: they mostly wait on smbd's timers.
# Measured alone on 2 cores (docs/tests.md): 4 at a time 546 s, 8 456 s,
# 12 354 s, 16 283 s; at 16 every lease and oplock run goes at once, and the
# matrix takes about its longest run, so more width cannot help. make test
# runs 10: the matrix shares the machine with another lane there, and at 12
# (every worker busy from the start, stop 52) test-smb's throwaway Cassandra
# did not start within its 120 s beside it, at a load average of 21.
TORTURE_PARALLEL ?= 10
# scripts/steps.py: make targets in lanes side by side, each step's output
# whole as it ends, and a table of each step's wall time at the end
STEPS = $(PYTHON) scripts/steps.py

# The inner loop: the build, the C suite, the Python tests that start no
# server, and the conformance table on tdb.
check: all ## the inner loop (about a minute): C suite, unit tests, conformance on tdb
	@$(STEPS) --title "make check" --logs $(RESULTS)/check "test-c test-conformance-tdb" "test-python-unit"

# Every check. Two lanes side by side: the smbtorture matrix (each run
# mostly waits on smbd's timers; 10 at a time keep both cores busy) and the
# quick steps; then, one after the other
# with nothing beside them, memcheck beside pytest's unit tests (valgrind
# runs on one core and left the other idle for its 82 s), the conformance
# tables and pytest's tests that start a server, whose leases, timeouts,
# fuzz budgets and hand-overs are timed (with everything at once on 2 cores
# they failed, and valgrind beside the matrix took 604 s instead of 84:
# docs/tests.md). `all` and the scylla venv are built first, so no two
# steps build the same thing.
TEST_LANES := "test-torture-matrix" "test-c test-smb test-fuzz-proxy"
TEST_THEN  := test-memcheck+test-python-unit test-conformance test-python-servers
test: all venv-scylla ## every test, in lanes side by side; each step's time at the end
	@$(STEPS) --title "make test" --logs $(RESULTS)/test --then "$(TEST_THEN)" $(TEST_LANES)

# make test without the smbtorture matrix.
test-fast: all venv-scylla ## make test without the smbtorture matrix
	@$(STEPS) --title "make test-fast" --logs $(RESULTS)/test-fast --then "$(TEST_THEN)" \
		"test-c" "test-smb test-fuzz-proxy"

# The longer matrix, run before an issue is resolved (CI runs `make test`):
# everything in `make test`, the fresh roots, smbtorture on the node-cache
# configurations `make test` leaves out, proxy mode on every adapter, and the
# three-node clusters. `make soak-etcd` is separate (~30 min).
TEST_FULL := test test-fresh test-deb test-trixie test-sid test-torture-matrix-full test-torture-matrix-long test-torture-scylla \
	test-conformance-proxy test-conformance-scylla test-python-full test-cluster test-sid-cluster
test-full: $(TEST_FULL) ## make test, the three fresh roots, the longer matrices, the clusters

# The two commands on a fresh Debian 12 root (a cached debootstrap minbase,
# in a chroot) on a clone of the committed HEAD: `make demo`, then `make
# test-setup`. Needs root; see scripts/test-fresh.sh.
test-fresh: ## make demo and make test-setup in a fresh Debian 12 root
	@scripts/test-fresh.sh

# What a fresh root must show beyond the demo: that the set-up brought
# every file the project uses (test_install_deps) and every throwaway
# server (one conformance table each on etcd, rados, cassandra and the fdb
# model, and one smbtorture suite on etcd against native), the quick loop,
# and the open loop's client built on libsmbclient (make bench-elastic).
test-setup: check venv-scylla $(OPEN_LOOP_BIN) ## what proves a fresh root's set-up: install checks, each server once
	$(VPY) -m pytest -q tests/python/test_install_deps.py
	@$(STEPS) --title "make test-setup" --logs $(RESULTS)/test-setup "test-conformance-servers"
	$(VPY) -m dbwrap_py.cli torture --suite smb2.durable-v2-open --config etcd

# The same on Debian 13 (Samba 4.22, Python 3.13): `make demo`, then `make test`.
test-trixie: ## make demo and make test in a fresh Debian 13 root
	@FRESH_SUITE=trixie FRESH_TARGETS="demo test" scripts/test-fresh.sh

# CI's part of it: `make demo`, then `make test-core` on Debian 13.
test-trixie-core: ## make demo and make test-core in a fresh Debian 13 root (CI)
	@FRESH_SUITE=trixie FRESH_PREPARED=1 FRESH_TARGETS="demo test-core" scripts/test-fresh.sh

# Samba 4.25 (Debian sid): see scripts/fresh/registry-access.sh for the root's apt.
test-sid: ## make demo, make test and the persistent-handle suites in a fresh Debian sid root (Samba 4.25)
	@FRESH_SUITE=sid FRESH_TARGETS="demo test test-torture-persistent" scripts/test-fresh.sh

test-sid-cluster: ## make demo and the three-node cluster tests in a fresh Debian sid root (Samba 4.25)
	@FRESH_SUITE=sid FRESH_TARGETS="demo test-cluster" scripts/test-fresh.sh

test-sid-torture-failover: ## make demo and smbtorture's failover suites on the three-node cluster in a fresh Debian sid root (Samba 4.25)
	@FRESH_SUITE=sid FRESH_TARGETS="demo test-cluster-torture-failover" scripts/test-fresh.sh

test-sid-core: ## make demo, make check and tests/smb in a fresh Debian sid root (Samba 4.25; CI)
	@FRESH_SUITE=sid FRESH_PREPARED=1 FRESH_TARGETS="demo check test-smb" scripts/test-fresh.sh

# The core of make test, for CI on another platform (Debian 13): the C
# suite, the unit tests, conformance for tdb and etcd, and smbtorture
# through bridge+tdb and bridge+etcd, both short, against native. The tests
# on the other throwaway servers (Ceph 18, Cassandra on JDK 21, ZooKeeper)
# and smbtorture's three longest suites run there in make test-trixie
# (make test-full): with them this step took 13 min of CI's 45 (stop 52).
# pytest 2 at a time here (PYTEST_WORKERS, read by the steps' make).
test-core: all ## C suite, unit tests, conformance and smbtorture (short) on tdb and etcd
	@PYTEST_WORKERS=2 $(STEPS) --title "make test-core" --logs $(RESULTS)/test-core \
		--then "test-conformance-core" "test-torture-core" "test-c test-python-unit"

test-conformance-core: all ## the conformance tables for tdb and etcd
	$(VPY) -m dbwrap_py.cli check tdb
	$(VPY) -m dbwrap_py.cli check etcd -o lease_ttl=2

# both without the three longest suites (make test runs them on tdb)
test-torture-core: all ## smbtorture on bridge+tdb and bridge+etcd (short) against native
	$(VPY) -m dbwrap_py.cli torture --parallel $(TORTURE_PARALLEL) --config-short tdb --config-short etcd

# bridge+proxy: the tdb adapter in a throwaway node daemon
test-c: all ## the C suite: Samba's dbwrap front end on native tdb and the bridge
	DBWRAP_PY_PATH=$(CURDIR)/tests/fixtures $(VPY) -m dbwrap_py.proxy.around $(TEST_BIN)

# The C suite and the do_locked value check under valgrind memcheck.
test-memcheck: all ## the C suite and do_locked's value under valgrind memcheck
	@scripts/memcheck.sh

# pytest tests/python: the tests that start no server, then those that do
# (make test runs the second part alone), then the scylla dialect in its
# venv. Tests marked `alone` run after the others, by themselves (pytest
# exits 5 when none is marked).
test-python: test-python-unit test-python-servers ## pytest tests/python, 4 at a time; scylla in its venv

test-python-unit: venv $(BRIDGE_LIB) $(INPROC_LIB) ## pytest tests/python without the tests that start a server
	$(VPY) -m pytest -q $(PYTEST_PARALLEL) -m "not server and not alone and not full" tests/python

test-python-servers: venv venv-scylla $(BRIDGE_LIB) $(INPROC_LIB) ## pytest's tests that start a server
	$(VPY) -m pytest -q $(PYTEST_PARALLEL) -m "server and not alone and not full" tests/python
	$(VPY) -m pytest -q -m "alone and not full" tests/python || [ $$? -eq 5 ]
	$(VPY_SCYLLA) -m pytest -q tests/python/test_scylla_dialect.py

# The fault tests on three-node Cassandras (marked full): each starts a
# cluster and kills nodes, a minute or more; make test-full runs them.
test-python-full: venv $(BRIDGE_LIB) $(INPROC_LIB) ## pytest's fault tests on three-node Cassandras (in make test-full)
	$(VPY) -m pytest -q --durations=12 -m full tests/python

# The adapter conformance suite: the tables for tdb, memory, etcd (on a
# throwaway etcd, 2 s leases to keep it short) and rados (on a throwaway
# one-OSD Ceph, 2 s record locks), cassandra (on a throwaway one-node
# Cassandra, 2 s record locks), then the other adapters and
# every broken example under pytest. etcd, rados and cassandra run twice: without and
# with the node cache (a throwaway node agent beside the throwaway store);
# sqlite_leased with the node cache too (a throwaway agent on a temporary
# cluster file; without it, it runs under pytest). fdb runs on a throwaway
# model of FoundationDB (no FoundationDB can run here), without and with the
# node cache: its tables say fdb (model); zookeeper on a throwaway server
# (Debian's jar), without and with the node cache. The tables that use separate
# servers run side by side, in three lanes, Cassandra's (the longest) alone:
# 294 s against 327 in two lanes (stop 52, alone on the machine).
test-conformance: all venv-scylla ## every adapter's conformance table, with and without the node cache
	@$(STEPS) --title "make test-conformance" --logs $(RESULTS)/test-conformance \
		"test-conformance-cassandra" "test-conformance-local test-conformance-tdb test-conformance-zookeeper" \
		"test-conformance-rados test-conformance-etcd test-conformance-fdb"

test-conformance-tdb: all ## the conformance tables for tdb and memory (no server)
	$(VPY) -m dbwrap_py.cli check tdb
	$(VPY) -m dbwrap_py.cli check memory

# pytest conformance/tests on pytest-xdist's workers (each conformance_tests()
# suite one group): 55 s against 109-131 serially (docs/tests.md).
test-conformance-local: all ## conformance: sqlite_leased with the node cache, tdb via the proxy, pytest conformance/tests
	$(VPY) -m dbwrap_py.cli check sqlite_leased -o node_cache=yes
	$(VPY) -m dbwrap_py.cli check tdb -o transport=proxy
	$(VPY) -m dbwrap_py.cli check sqlite_leased -o transport=proxy -o node_cache=yes
	$(VPY) -m pytest -q $(PYTEST_PARALLEL) conformance/tests

test-conformance-etcd: all ## conformance on a throwaway etcd, without and with the node cache
	$(VPY) -m dbwrap_py.cli check etcd -o lease_ttl=2 --variant node_cache=yes

test-conformance-rados: all ## conformance on a throwaway Ceph, without and with the node cache
	$(VPY) -m dbwrap_py.cli check rados -o lease=2 --variant node_cache=yes

test-conformance-cassandra: all ## conformance on a throwaway Cassandra, without and with the node cache
	$(VPY) -m dbwrap_py.cli check cassandra -o lease=2 --variant node_cache=yes

# The scylla dialect's table starts a Cassandra of its own (no Scylla server
# can be had here); make test runs the dialect's pytest, make test-full this.
test-conformance-scylla: all venv-scylla ## conformance: the scylla dialect on a throwaway Cassandra (in make test-full)
	$(VPY_SCYLLA) -m dbwrap_py.cli check scylla -o lease=2

test-conformance-fdb: all ## conformance on the fdb model, without and with the node cache
	$(VPY) -m dbwrap_py.cli check fdb -o fdb_library=model --variant node_cache=yes

test-conformance-zookeeper: all ## conformance on a throwaway ZooKeeper, without and with the node cache
	$(VPY) -m dbwrap_py.cli check zookeeper -o session_timeout=2 --variant node_cache=yes

# One table on each throwaway server (test-setup).
test-conformance-servers: all ## one conformance table on each throwaway server (test-setup)
	$(VPY) -m dbwrap_py.cli check etcd -o lease_ttl=2
	$(VPY) -m dbwrap_py.cli check rados -o lease=2
	$(VPY) -m dbwrap_py.cli check cassandra -o lease=2
	$(VPY) -m dbwrap_py.cli check fdb -o fdb_library=model

# The same tables in proxy mode (each table starts a throwaway node daemon;
# one throwaway store serves an adapter's tables):
# every adapter that can run here, with and without the node cache, and with
# the node cache both ways: smbd reaching it itself (proxy_fastpath, the
# default) and every call through the daemon (proxy_fastpath=no).
test-conformance-proxy: all ## every conformance table in proxy mode (make test-full)
	$(VPY) -m dbwrap_py.cli check sqlite_leased -o transport=proxy --variant "node_cache=yes proxy_fastpath=no"
	$(VPY) -m dbwrap_py.cli check etcd -o transport=proxy -o lease_ttl=2 \
		--variant "node_cache=yes proxy_fastpath=no" --variant node_cache=yes
	$(VPY) -m dbwrap_py.cli check rados -o transport=proxy -o lease=2 \
		--variant "node_cache=yes proxy_fastpath=no" --variant node_cache=yes
	$(VPY) -m dbwrap_py.cli check cassandra -o transport=proxy -o lease=2 \
		--variant "node_cache=yes proxy_fastpath=no" --variant node_cache=yes
	$(VPY) -m dbwrap_py.cli check fdb -o transport=proxy -o fdb_library=model \
		--variant "node_cache=yes proxy_fastpath=no" --variant node_cache=yes
	$(VPY) -m dbwrap_py.cli check zookeeper -o transport=proxy -o session_timeout=2 \
		--variant "node_cache=yes proxy_fastpath=no" --variant node_cache=yes

# Three-node Samba clusters (ctdb; etcd, rados, cassandra and the fdb model,
# each without and with the node cache; and a broken one the checks must
# fail on): clients on different nodes (make test-full).
test-cluster: all ## three-node Samba clusters, every adapter and ctdb (make test-full)
	$(VPY) -m pytest -q tests/cluster

# Samba 4.25: a persistent handle moves to a surviving node with its lock
# (ctdb; etcd, with and without the node cache; rados and cassandra with it;
# a node cache broken on purpose must fail: tests/cluster/conftest.py).
# PERSISTENT_RUNS clusters per configuration; the summary gives each one's
# median and worst time from the kill to the reclaim. PERSISTENT_K picks
# configurations (pytest -k, e.g. PERSISTENT_K=lost: a replica lost too);
# PERSISTENT_CONFIGS names them exactly, comma-separated (e.g. etcd,ctdb).
PERSISTENT_RUNS ?= 1
PERSISTENT_K ?=
PERSISTENT_CONFIGS ?=
test-cluster-persistent: all ## Samba 4.25: a persistent handle survives its node's death (3-node clusters)
	@[ "$(SAMBA_VERSION_NUMBER)" -ge 42500 ] || { echo "test-cluster-persistent: persistent" \
		"handles need Samba 4.25 or later; this is $(SAMBA_VERSION) (make test-sid-cluster has 4.25)" >&2; exit 1; }
	PERSISTENT_FAILOVER_RUNS=$(PERSISTENT_RUNS) PERSISTENT_CONFIGS='$(PERSISTENT_CONFIGS)' $(VPY) -m pytest -q -s -rA \
		$(if $(PERSISTENT_K),-k '$(PERSISTENT_K)') tests/cluster/test_persistent_failover.py

# Samba 4.25: smbtorture's failover suites (smb2.persistent-open-failover,
# reconnect-contended-failover) on three-node clusters: each node in a network
# namespace of its own, a ctdb public address that moves when smbtorture stops
# the node serving it (ctdb, and etcd with the node cache), and Samba's
# selftest's line without one (--unclist). Needs root, ip (iproute2) and
# ethtool; every namespace, veth and bridge is removed again.
test-cluster-torture-failover: all ## Samba 4.25: smbtorture's failover suites, ctdb public address moving between 3 nodes
	@[ "$(SAMBA_VERSION_NUMBER)" -ge 42500 ] || { echo "test-cluster-torture-failover: smbtorture's" \
		"failover suites need persistent handles, Samba 4.25 or later; this is $(SAMBA_VERSION)" \
		"(make test-sid-torture-failover has 4.25)" >&2; exit 1; }
	$(VPY) -m pytest -q -s -rA tests/cluster/test_torture_failover.py

# The installed smbd and Samba tools on the bridge (needs root, as smbd does).
test-smb: all ## the installed smbd and Samba's tools through the preload
	$(VPY) -m pytest -q tests/smb

# smbtorture's smb2 suites on `make test`'s bridge configurations, each
# against one native run of every suite, $(TORTURE_PARALLEL) smbtorture runs
# at a time (the runs mostly wait on smbd's timers): tdb, etcd with the node
# cache and rados run every suite; tdb in proxy mode, etcd without the node
# cache, cassandra and the model of FoundationDB (not FoundationDB, which
# cannot run here; these two brief, below) leave out the three longest suites (smb2.oplock,
# smb2.lease, smb2.durable-open: 3 to 25 times native's time there, and
# most of the matrix's; smbtorture.LONG_SUITES gives the figures), which
# test-torture-matrix-long runs on them in make test-full. Proxy mode
# carries the same dbwrap calls as tdb in process, which runs them; its
# three took 380 s of the matrix's runs (stop 53, where the matrix kept
# both cores busy). Each configuration starts its throwaway server.
# Cassandra and the fdb model, whose every record operation is a consensus
# round, also leave out smb2.lock and smb2.durable-v2-open (brief: 273 and
# 290 s through Cassandra, native 5 and 21 s; smbtorture.BRIEF_SUITES),
# which test-torture-matrix-long runs on them too.
TORTURE_CONFIGS := tdb etcd,node_cache=yes rados
TORTURE_CONFIGS_SHORT := tdb,transport=proxy etcd
TORTURE_CONFIGS_BRIEF := cassandra fdb,fdb_library=model
test-torture-matrix: all ## smbtorture's smb2 suites, every adapter against native
	$(VPY) -m dbwrap_py.cli torture --parallel $(TORTURE_PARALLEL) $(addprefix --config ,$(TORTURE_CONFIGS)) \
		$(addprefix --config-short ,$(TORTURE_CONFIGS_SHORT)) $(addprefix --config-brief ,$(TORTURE_CONFIGS_BRIEF))

# The suites test-torture-matrix leaves out on its slowest configurations (make test-full).
test-torture-matrix-long: all ## the suites test-torture-matrix leaves out, on the configurations that leave them out (make test-full)
	$(VPY) -m dbwrap_py.cli torture --parallel $(TORTURE_PARALLEL) \
		--suite smb2.oplock --suite smb2.lease --suite smb2.durable-open \
		$(addprefix --config ,$(TORTURE_CONFIGS_SHORT) $(TORTURE_CONFIGS_BRIEF))
	$(VPY) -m dbwrap_py.cli torture --parallel $(TORTURE_PARALLEL) \
		--suite smb2.lock --suite smb2.durable-v2-open $(addprefix --config ,$(TORTURE_CONFIGS_BRIEF))

# The node-cache and proxy configurations `make test` leaves out (make test-full).
TORTURE_CONFIGS_FULL := etcd,node_cache=write-through sqlite_leased,node_cache=yes rados,node_cache=yes \
	cassandra,node_cache=yes fdb,fdb_library=model,node_cache=yes etcd,transport=proxy \
	rados,transport=proxy etcd,transport=proxy,node_cache=yes
test-torture-matrix-full: all ## smbtorture on the node-cache and proxy configurations (make test-full)
	$(VPY) -m dbwrap_py.cli torture --parallel $(TORTURE_PARALLEL) $(addprefix --config ,$(TORTURE_CONFIGS_FULL))

# SMB3 persistent handles (Samba 4.25): the persistent-handle suites on a
# continuously available share, native against tdb, etcd (with and without
# the node cache), rados and cassandra.
TORTURE_PERSISTENT_CONFIGS := tdb etcd etcd,node_cache=yes rados cassandra
test-torture-persistent: all ## Samba 4.25: the persistent-handle suites, every replicated adapter against native
	@[ "$(SAMBA_VERSION_NUMBER)" -ge 42500 ] || { echo "test-torture-persistent: persistent" \
		"handles need Samba 4.25 or later; this is $(SAMBA_VERSION) (make test-sid has 4.25)" >&2; exit 1; }
	$(VPY) -m dbwrap_py.cli torture --persistent-handles --parallel $(TORTURE_PARALLEL) \
		$(addprefix --config ,$(TORTURE_PERSISTENT_CONFIGS))

# One configuration against native tdb, side by side, e.g.
# make test-torture TORTURE_CONFIG=etcd,node_cache=yes (default: tdb).
TORTURE_CONFIG ?= tdb
test-torture: all ## smbtorture on one configuration: TORTURE_CONFIG=etcd,node_cache=yes
	$(VPY) -m dbwrap_py.cli torture --parallel $(TORTURE_PARALLEL) --config $(TORTURE_CONFIG)

# Random, truncated and mutated requests at a throwaway node daemon for 30 s:
# it must stay up, with no record left locked. Then the other way, 20 s of
# bad replies from a fake daemon to smbd's side, the C client with
# AddressSanitizer and UBSan (build/proxy_client): it must never crash, give
# every call an NTSTATUS, and hang up where it must. Its broken example
# (build/proxy_client_broken) runs in tests/python/test_proxy_client.py.
# Last, 15 s of malformed HTTP replies from a fake etcd gateway at the etcd
# adapter's client (adapters/etcd/client.py): every call returns its type or
# raises a typed error, within its timeout, without allocating what a reply
# claims. Its broken example runs in tests/python/test_etcd_client.py.
test-fuzz-proxy: all ## 30 s of malformed requests at a throwaway node daemon, 20 s of malformed replies at the C client, 15 s at the etcd client
	$(VPY) -m dbwrap_py.proxy.fuzz 30
	$(VPY) -m dbwrap_py.proxy.fuzz_client $(PROXY_CLIENT_BIN) 20
	$(VPY) -m dbwrap_py.testing.fuzz_etcd_client 15

# The scylla dialect (scylla-driver, its own venv) against the same throwaway
# Cassandra: no ScyllaDB server can be had here.
test-torture-scylla: all venv-scylla ## smbtorture on the scylla dialect (make test-full)
	$(VPY_SCYLLA) -m dbwrap_py.cli torture --parallel $(TORTURE_PARALLEL) --adapter scylla

##@ Demo and benchmarks (they measure; none is part of make test)
# The main job: a real smbd on the bridge, opens/s against native tdb.
demo: all ## the main job: a real smbd on the bridge, opens/s against native tdb
	@$(VPY) -m dbwrap_py.cli demo

# Samba 4.25: persistent handles' cost, a CA share against a plain one.
bench-ca: all ## Samba 4.25: opens/s with persistent handles, CA share against plain, native and bridged
	@[ "$(SAMBA_VERSION_NUMBER)" -ge 42500 ] || { echo "bench-ca: persistent handles need" \
		"Samba 4.25 or later; this is $(SAMBA_VERSION)" >&2; exit 1; }
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench ca --json $(RESULTS)/bench-ca.json

# Samba 4.25 on three-node clusters: opens/s on the CA share at 1-64 clients
# and the bytes each persistent open costs the store, ctdb against etcd, rados
# and cassandra with the node cache, one cluster at a time (~10 min here).
# CA_CLUSTER_ARGS: more of its options, e.g. "--nprocs 1 --backends rados".
bench-ca-cluster: all ## Samba 4.25: opens/s on a CA share across 3 nodes and bytes per persistent open, against ctdb
	@[ "$(SAMBA_VERSION_NUMBER)" -ge 42500 ] || { echo "bench-ca-cluster: persistent handles need" \
		"Samba 4.25 or later; this is $(SAMBA_VERSION)" >&2; exit 1; }
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench ca-cluster --json $(RESULTS)/bench-ca-cluster.json $(CA_CLUSTER_ARGS)

# Measures only; never part of `make test`.
bench-bridge: all $(BENCH_BIN) ## the bridge alone in C, and instructions per call (callgrind)
	@mkdir -p $(RESULTS)
	$(BENCH_BIN) 20000 $(RESULTS)/bench-bridge.json
	$(VPY) -m dbwrap_py.cli bench instructions --json $(RESULTS)/bench-instructions.json

# Every landed adapter against native tdb: SMB sweep, micro, memory (~10 min).
bench: all $(MICRO_BIN) ## every adapter against native tdb: SMB sweep, micro, memory (~10 min)
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench smb --nprocs 1,2,4,8,16,32,64,128 --time 8 \
		--json $(RESULTS)/bench-smb.json
	$(VPY) -m dbwrap_py.cli bench micro --time 1 --json $(RESULTS)/bench-micro.json
	$(VPY) -m dbwrap_py.cli bench memory --connections 1,16,64 \
		--json $(RESULTS)/bench-memory.json

# bridge+tdb in process and through the node daemon (proxy mode) against
# native tdb, BENCH_SMB_ROUNDS paired rounds per point.
# e.g. make BENCH_SMB_NPROCS=64 BENCH_SMB_ROUNDS=8 bench-smb: more rounds where
# the rate is noisy (64 smbd on 2 cores)
BENCH_SMB_NPROCS ?= 1,4,16,64
BENCH_SMB_ROUNDS ?= 3
bench-smb: all ## bridge+tdb in process and via the node daemon against native tdb
	$(VPY) -m dbwrap_py.cli bench smb --adapters tdb --transports inproc,proxy --nprocs $(BENCH_SMB_NPROCS) \
		--time 8 --rounds $(BENCH_SMB_ROUNDS) --json $(RESULTS)/bench-smb-tdb.json

# Memory per smbd client process in process and in proxy mode, against
# native, at 1 to 256 connections, for etcd, rados and cassandra (throwaway
# servers); the node daemon's own memory is reported apart.
bench-memory-proxy: all ## memory per smbd process, in process and proxy mode, etcd, rados, cassandra
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench memory --adapters etcd,rados,cassandra --transports inproc,proxy \
		--connections 1,16,64,256 --json $(RESULTS)/bench-memory-proxy.json

# etcd with the node cache (a throwaway etcd and node agent) against native
# tdb, three paired rounds per point: all eight volatile databases
# write-back; the seed's configuration (smbXsrv_open_global node-local, on
# native tdb); smbXsrv_open_global write-through (what a durable handle's
# reconnect on another node needs), the rest write-back. The first also
# through the node daemon (proxy mode). Then its memory per smbd process.
bench-etcd: all ## etcd with the node cache against native tdb, three ways
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
bench-rados: all $(MICRO_BIN) ## rados at three omap ratios, its memory, the node cache
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
bench-cassandra: all $(MICRO_BIN) ## cassandra without and with the node cache
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench smb --adapters cassandra --nprocs 1,4,16,64 --time 8 --rounds 2 \
		--json $(RESULTS)/bench-smb-cassandra.json
	$(VPY) -m dbwrap_py.cli bench smb --adapters cassandra -o cassandra:node_cache=yes --nprocs 1,4,16,64 \
		--time 8 --rounds 2 --json $(RESULTS)/bench-smb-cassandra-cache.json
	$(VPY) -m dbwrap_py.cli bench memory --adapters cassandra --connections 1,16,64 \
		--json $(RESULTS)/bench-memory-cassandra.json
	$(VPY) -m dbwrap_py.cli bench micro --adapters cassandra --time 1 \
		--json $(RESULTS)/bench-micro-cassandra.json

# zookeeper (a throwaway one-server ZooKeeper) against native tdb, two
# paired rounds per point; its memory and threads per smbd process; round
# trips per dbwrap operation (bench micro). No node cache yet.
bench-zookeeper: all $(MICRO_BIN) ## zookeeper against native tdb: SMB sweep, memory, micro
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench smb --adapters zookeeper --nprocs 1,4,16,64 --time 8 --rounds 2 \
		--json $(RESULTS)/bench-smb-zookeeper.json
	$(VPY) -m dbwrap_py.cli bench memory --adapters zookeeper --connections 1,16,64 \
		--json $(RESULTS)/bench-memory-zookeeper.json
	$(VPY) -m dbwrap_py.cli bench micro --adapters zookeeper --time 1 \
		--json $(RESULTS)/bench-micro-zookeeper.json

# fdb on the model of FoundationDB (a throwaway model server), labelled
# "fdb (model)": its figures are the model's, never FoundationDB's. Against
# native tdb, two paired rounds per point, without and with the node cache;
# memory and threads per smbd process; round trips per dbwrap operation.
bench-fdb-model: all $(MICRO_BIN) ## fdb on the model of FoundationDB (a model, not FoundationDB)
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
# CLUSTER_NETWORK: loopback, or a profile (lan, region, multi-region, wan,
# local: docs/benchmarks.md); CLUSTER_WORKLOAD: shared or own-files;
# CLUSTER_ADAPTERS: auto, or a list (ctdb-sticky: ctdb with sticky records).
# The results file names the network and workload when not the defaults.
CLUSTER_NETWORK  ?= loopback
CLUSTER_WORKLOAD ?= shared
CLUSTER_ADAPTERS ?= auto
CLUSTER_JSON = $(RESULTS)/bench-cluster$(if $(filter-out loopback,$(CLUSTER_NETWORK)),-$(CLUSTER_NETWORK))$(if $(filter-out shared,$(CLUSTER_WORKLOAD)),-$(CLUSTER_WORKLOAD)).json
bench-cluster: all ## three-node clusters, 1-512 clients, every adapter against ctdb (~35 min); CLUSTER_NETWORK=lan ...
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench cluster --nprocs 1,2,4,8,16,32,64,128,256,512 --time 5 \
		--rounds 2 --adapters $(CLUSTER_ADAPTERS) --network $(CLUSTER_NETWORK) \
		--workload $(CLUSTER_WORKLOAD) --json $(CLUSTER_JSON)

# Node 2 of three is killed or leaves (ctdb stop, then stopped), or a fourth
# node joins, while 64 clients open and close one file on nodes 0 and 1:
# their opens/s in 0.5 s bins (build/smb_open_loop), ctdb against every
# adapter with the node cache; a fresh cluster per run. ~17 min here.
ELASTIC_ADAPTERS ?= etcd+cache,rados+cache,cassandra+cache,fdb+cache,zookeeper+cache
bench-elastic: all $(OPEN_LOOP_BIN) ## opens/s in 0.5 s bins while a node is killed, leaves or joins: ctdb and each adapter with the node cache (~17 min)
	@mkdir -p $(RESULTS)
	$(VPY) -m dbwrap_py.cli bench elastic --adapters $(ELASTIC_ADAPTERS) --json $(RESULTS)/bench-elastic.json

# 500 path-contention points on etcd with the node cache (1 and 16 connections
# in turn, one long-lived smbd and node agent); stops at the first failed
# point and prints what explains it. Not part of make test.
soak-etcd: all ## 500 path-contention points on etcd with the node cache (~30 min)
	$(VPY) -m dbwrap_py.cli soak --adapter etcd --points 500 --nprocs 1,16 --time 3


##@ The Debian package (an operator's install: docs/packaging.md)
deb: deps ## build/deb/dbwrap-py_VERSION_ARCH.deb, by dpkg-buildpackage on a copy of the tree
	@scripts/build-deb.sh

test-deb: deb ## install the .deb in a fresh Debian 12 root; smbd as its drop-in starts it, on etcd through the daemon as its unit starts it
	@FRESH_DEB=$(firstword $(wildcard $(BUILD)/deb/dbwrap-py_*.deb)) scripts/test-fresh.sh

# What packaging/debian/rules runs in that copy: the C libraries built for
# an installed system, then everything put under DESTDIR. The libraries
# other than the preload go to a folder of their own (nothing else links
# them); the Python package to the system python3's dist-packages, where
# smbd's embedded interpreter, the daemon, the agent and their helpers
# (python3 -I) all find it.
PKG_LIBDIR     = /usr/lib/$(MULTIARCH)
PKG_PRIVATE    = $(PKG_LIBDIR)/dbwrap_py
PKG_PYTHONDIR := /usr/lib/python3/dist-packages
PKG_BUILD     := $(BUILD)/pkg
# `make deb PKG_INSTALLED_CFLAGS=` builds the broken example: a package
# whose bridge takes $DBWRAP_PY_VENV and $DBWRAP_PY_PATH as a checkout's
# does, which tests/package/installed_smbd.py must refuse
PKG_INSTALLED_CFLAGS := -DDBWRAP_PY_INSTALLED

package-build: ## (packaging/debian/rules) the C libraries built for an installed system, in build/pkg
	CFLAGS='$(CFLAGS_GIVEN)' $(MAKE) DEPS= BUILD=$(PKG_BUILD) INSTALLED_CFLAGS='$(PKG_INSTALLED_CFLAGS)' \
		PRELOAD_RPATH=$(PKG_PRIVATE) $(PKG_BUILD)/libdbwrap_py_preload.so

package-install: ## (packaging/debian/rules) everything the package installs, under DESTDIR
	install -d $(DESTDIR)$(PKG_PRIVATE) $(DESTDIR)$(PKG_PYTHONDIR)
	install -m 0644 $(PKG_BUILD)/libdbwrap_py.so $(PKG_BUILD)/libdbwrap_py_inproc.so $(DESTDIR)$(PKG_PRIVATE)/
	install -m 0644 $(PKG_BUILD)/libdbwrap_py_preload.so $(DESTDIR)$(PKG_LIBDIR)/
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation --no-compile --root-user-action=ignore \
		--target $(DESTDIR)$(PKG_PYTHONDIR) .
	rm -rf $(DESTDIR)$(PKG_PYTHONDIR)/bin $(DESTDIR)$(PKG_PYTHONDIR)/dbwrap_py-*.dist-info/direct_url.json
	install -D -m 0755 packaging/dbwrap-py $(DESTDIR)/usr/bin/dbwrap-py
	install -D -m 0644 -t $(DESTDIR)/lib/systemd/system packaging/systemd/dbwrap-py-proxy.service \
		packaging/systemd/dbwrap-py-node-agent.service
	install -d $(DESTDIR)/lib/systemd/system/smbd.service.d
	sed 's|@PRELOAD@|$(PKG_LIBDIR)/libdbwrap_py_preload.so|' packaging/systemd/smbd-dbwrap-py.conf \
		> $(DESTDIR)/lib/systemd/system/smbd.service.d/dbwrap-py.conf
	install -D -m 0644 packaging/tmpfiles.d/dbwrap-py.conf $(DESTDIR)/usr/lib/tmpfiles.d/dbwrap-py.conf
	install -d -m 0755 $(DESTDIR)/etc/dbwrap_py
	install -D -m 0644 -t $(DESTDIR)/usr/share/doc/dbwrap-py/examples packaging/examples/daemon.conf \
		packaging/examples/node-agent.options configs/smb.conf.example
	install -D -m 0644 -t $(DESTDIR)/usr/share/doc/dbwrap-py README.md docs/packaging.md

##@ Servers (each until Ctrl-C; prints the options that reach it)
server-etcd: all ## a throwaway etcd (dbwrap-py server etcd)
	$(VPY) -m dbwrap_py.cli server etcd

server-ceph: all ## a throwaway one-OSD Ceph (dbwrap-py ceph)
	$(VPY) -m dbwrap_py.cli ceph

server-cassandra: all ## a throwaway one-node Cassandra (dbwrap-py cassandra)
	$(VPY) -m dbwrap_py.cli cassandra

server-zookeeper: all ## a throwaway one-server ZooKeeper (dbwrap-py zookeeper; --nodes 3 there: an ensemble)
	$(VPY) -m dbwrap_py.cli zookeeper

server-samba: all ## a throwaway smbd on bridge+tdb (dbwrap-py samba)
	$(VPY) -m dbwrap_py.cli samba

FORCE:
