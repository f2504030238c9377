"""The Debian package's parts that need no package build (make deb and the
install in a fresh root are make test-deb's): its systemd units start
commands our CLI accepts, and its Depends pin the Samba it is built for."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from dbwrap_py.nodecache.agent import build_parser as agent_parser
from dbwrap_py.paths import built_samba_release
from dbwrap_py.proxy.daemon import build_parser as daemon_parser
from dbwrap_py.registry import adapter_names

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "packaging" / "systemd"


def _installed_smbd():
    """tests/package/installed_smbd.py: its unit parsing, the one the
    install test uses to start what the units start."""
    spec = importlib.util.spec_from_file_location("installed_smbd", ROOT / "tests/package/installed_smbd.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _command(unit: str) -> list[str]:
    units = _installed_smbd()
    settings = units.unit_settings(SYSTEMD / unit)
    return units.command_of(settings, units.environment_of(settings))


def test_the_node_agent_unit_starts_a_valid_agent_command():
    """ExecStart, with the unit's default ADAPTER and CACHE_DIR, is a
    node-agent command line the agent accepts, options from a file."""
    argv = _command("dbwrap-py-node-agent.service")
    assert argv[:2] == ["/usr/bin/dbwrap-py", "node-agent"]
    args = agent_parser().parse_args(argv[2:])
    assert args.adapter in adapter_names() and args.cache_dir.startswith("/")
    assert args.options_file and not args.option  # no option, no secret on argv


def test_the_proxy_unit_starts_a_daemon_that_its_configuration_decides():
    argv = _command("dbwrap-py-proxy.service")
    assert argv[:2] == ["/usr/bin/dbwrap-py", "proxy-daemon"]
    args = daemon_parser().parse_args(argv[2:])
    assert args.config == "/etc/dbwrap_py/daemon.conf"
    assert args.socket.startswith("/run/dbwrap_py/")


def test_smbds_drop_in_preloads_the_installed_library():
    units = _installed_smbd()
    env = units.environment_of(units.unit_settings(SYSTEMD / "smbd-dbwrap-py.conf"))
    assert env["LD_PRELOAD"] == "@PRELOAD@"  # the Makefile's package-install puts the path in


def test_the_package_depends_on_exactly_the_samba_release_it_is_built_for():
    release = built_samba_release()
    depends = subprocess.run([str(ROOT / "scripts/package-depends.sh")], capture_output=True, text=True,
                             check=True).stdout
    major, minor, patch = (int(n) for n in release.split("."))
    assert f"samba (>= 2:{release})" in depends
    assert f"samba (<< 2:{major}.{minor}.{patch + 1}~)" in depends
