"""Every relative link in the README and docs/ leads to a file of the
repository, and every #anchor to a heading of its page (GitHub's slugs):
the README is a map of pages, so a moved section must not leave a dead link."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _lines_outside_code(text: str) -> list[tuple[int, str]]:
    kept, fenced = [], False
    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append((number, line))
    return kept


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    for _, line in _lines_outside_code(page.read_text()):
        heading = re.match(r"^#{1,6} (.*)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
    return {slug if n == 0 else f"{slug}-{n}" for slug, count in seen.items() for n in range(count + 1)}


def broken_links(root: Path) -> list[str]:
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for number, line in _lines_outside_code(page.read_text()):
            for match in LINK.finditer(line):
                target = match.group(1)
                if re.match(r"^[a-z]+:", target):
                    continue  # a URL: not checked here
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                where = f"{page.relative_to(root)}:{number}: {target}"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                elif dest != root and root not in dest.parents:
                    broken.append(f"{where}: outside the repository")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where}: no heading #{anchor}")
    return broken


def test_every_link_of_the_readme_and_docs_leads_somewhere():
    assert broken_links(ROOT) == []


def test_a_dead_link_and_a_dead_anchor_are_found(tmp_path):
    """Broken on purpose: the check must fail on them."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Its part\n")
    (tmp_path / "README.md").write_text(
        "[fine](docs/page.md#its-part) [gone](docs/missing.md) [no part](docs/page.md#other)\n"
        "```\n[in code](nowhere.md)\n```\n")
    assert broken_links(tmp_path) == ["README.md:1: docs/missing.md: no such file",
                                      "README.md:1: docs/page.md#other: no heading #other"]
