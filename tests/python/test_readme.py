"""The adapter guide's example adapter (docs/writing-an-adapter.md, moved there
from the README) is the file the C suite runs, word for word."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_is_adapters_sqlite():
    guide = (ROOT / "docs" / "writing-an-adapter.md").read_text()
    source = (ROOT / "adapters" / "sqlite.py").read_text().rstrip("\n")
    assert f"```python\n{source}\n```" in guide


def test_every_test_the_readmes_attack_table_names_exists():
    """The "Nobody gets in" table names tests; each is a test function of
    that file (`file.py::test_x`, and `::test_y` for the same file)."""
    import re

    section = (ROOT / "README.md").read_text().split("## Nobody gets in", 1)[1].split("\n## ", 1)[0]
    named = []
    for row in section.splitlines():
        current = None
        for file, test in re.findall(r"`(?:([\w]+\.py))?::(test_\w+)`", row):
            current = file or current
            assert current, row
            named.append((current, test))
    assert len(named) >= 11
    for file, test in named:
        source = (ROOT / "tests" / "python" / file).read_text()
        assert f"def {test}(" in source, f"README names {file}::{test}, which does not exist"
