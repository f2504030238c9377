#!/bin/sh
# make test-deb, inside a fresh Debian root that has never seen the checkout
# (scripts/test-fresh.sh with FRESH_DEB): apt installs the package with what
# it depends on, and what the test itself needs (a throwaway etcd, smbclient,
# systemd-analyze); then installed_smbd.py runs on the root's own python3.
set -eu
cd "$(dirname "$0")"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends ./dbwrap-py_*.deb etcd-server smbclient systemd
exec python3 -I installed_smbd.py
