"""The C includes go one way: c_bridge/ and the Python C extensions include
c_core/, and c_core/ includes nothing of the project's but itself
(docs/architecture.md, "One include direction")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "c_core"
QUOTED = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _quoted_includes(path: Path) -> list[str]:
    return QUOTED.findall(path.read_text())


def _c_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in (".c", ".h"))


def _strays(files: list[Path], allowed: list[Path]) -> list[str]:
    """`file: "header"` for each quoted include found in none of allowed
    (the file's own folder is always allowed)."""
    return [f'{path.relative_to(ROOT)}: "{name}"'
            for path in files for name in _quoted_includes(path)
            if not any((folder / name).is_file() for folder in [path.parent, *allowed])]


def test_the_core_includes_only_itself():
    assert _c_files(CORE), "c_core/ holds no C"
    assert _strays(_c_files(CORE), []) == []


def test_the_python_extensions_include_the_core_and_never_the_bridge():
    extensions = _c_files(ROOT / "python") + _c_files(ROOT / "adapters")
    assert extensions
    assert _strays(extensions, [CORE]) == []


def test_the_bridge_includes_the_core_and_its_own_headers_only():
    assert _strays(_c_files(ROOT / "c_bridge"), [CORE]) == []
