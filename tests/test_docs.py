"""The documentation cannot drift from the code: every setting is listed, every link resolves,
the README stays a front door."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_docs() -> str:
    return "\n".join(p.read_text() for p in PAGES)


def test_every_setting_is_listed_with_its_default_and_nothing_else_is():
    from moonmind_worker.settings import Settings

    text = (ROOT / "docs" / "configuration.md").read_text()
    table = text[text.index("## Every setting"):]
    listed = set(re.findall(r"^\| .*?\| .*?\| `(\w+)` \|$", table, re.M))
    assert listed == set(Settings.model_fields)
    for name, field in Settings.model_fields.items():
        for alias in field.aliases:
            assert f"`{alias}`" in table, f"{alias} ({name}) is not in docs/configuration.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for target in re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for section in ("## Two commands", "## Use it from an agent (MCP)", "## Tests", "## Documentation"):
        assert section in text


def test_the_benchmarks_page_holds_current_figures_only():
    """Each benchmark's current figure and its command; earlier runs are in `git log -p BENCHMARKS.md`."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    lines = len(text.splitlines())
    assert lines <= 400, f"BENCHMARKS.md has {lines} lines (at most 400): replace superseded figures, don't add beside them"
    for section in ("## Goals", "<!-- bench:suite:begin -->", "<!-- bench:suite:end -->"):
        assert section in text
