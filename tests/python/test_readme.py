"""The README's example adapter is the file the C suite runs, word for word."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_is_adapters_sqlite():
    readme = (ROOT / "README.md").read_text()
    source = (ROOT / "adapters" / "sqlite.py").read_text().rstrip("\n")
    assert f"```python\n{source}\n```" in readme
