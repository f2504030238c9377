"""The adapter guide's example adapter (docs/writing-an-adapter.md, moved there
from the README) is the file the C suite runs, word for word."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_is_adapters_sqlite():
    guide = (ROOT / "docs" / "writing-an-adapter.md").read_text()
    source = (ROOT / "adapters" / "sqlite.py").read_text().rstrip("\n")
    assert f"```python\n{source}\n```" in guide
