"""The smb.conf snippets in configs/ parse with Samba's testparm and route only
databases that smbd really opens."""

import re
import subprocess
from pathlib import Path

import pytest

from dbwrap_py.registry import adapter_names
from dbwrap_py.samba import PERSISTENT_DATABASES, VOLATILE_DATABASES

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


SNIPPETS = sorted(p for p in CONFIGS.iterdir() if p.suffix in (".conf", ".example"))


@pytest.mark.parametrize("path", SNIPPETS, ids=lambda p: p.name)
def test_config_parses_and_routes_known_databases(path, tmp_path):
    text = path.read_text()
    if not text.lstrip("# \n").startswith("[global]") and "[global]" not in text:
        conf = tmp_path / "smb.conf"
        conf.write_text(f"[global]\n\tinclude = {path}\n")
    else:
        conf = path
    result = subprocess.run(["testparm", "-s", str(conf)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Unknown parameter" not in result.stderr
    dumped = result.stdout
    routed = set(re.findall(r"dbwrap_py:(\w+\.tdb) = yes", dumped, flags=re.I))
    assert routed, "routes no database"
    known = {d.lower() for d in VOLATILE_DATABASES + PERSISTENT_DATABASES}
    assert routed <= known
    module = re.search(r"dbwrap_py:module = (\S+)", dumped).group(1)
    assert module in adapter_names()
