"""A code block that continues an earlier one says so where the reader sees it: the
`<!-- continue -->` marker is invisible in the rendered site, so the block's first line is
the comment `# continuing the example above`. And each guide page states what it needs to
install in a visible admonition (`!!! note "Needs"`), as do the reference pages of `tg.nn`
and `tg.distributed`."""
from __future__ import annotations

from pathlib import Path

import pytest

from ._blocks import python_blocks

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# pages edited elsewhere that have not adopted the visible line yet
PENDING: set[str] = set()
NOTE = "# continuing the example above"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_continued_blocks_say_so(page):
    if page.name in PENDING:
        pytest.skip(f"{page.name}: visible continuation not adopted yet")
    for block in python_blocks(page):
        if block.marker("continue"):
            first = block.source.lstrip("\n").splitlines()[0].strip().lower()
            assert first.startswith(NOTE), (
                f"{page.name}:{block.line}: a continued block starts with '{NOTE}'")


GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))


@pytest.mark.parametrize("page", GUIDE, ids=[p.name for p in GUIDE])
def test_guide_page_states_what_it_needs(page):
    if page.name in PENDING:
        pytest.skip(f"{page.name}: its admonition is not added yet")
    head = page.read_text().split("\n## ")[0]
    assert '!!! note "Needs"' in head, f"{page.name}: state what it needs before its first section"


# reference pages whose names need an extra beyond `pip install tiga`
API_NEEDS = {"nn.md": "tiga[torch]", "distributed.md": "tiga[dist]"}


@pytest.mark.parametrize("name, extra", sorted(API_NEEDS.items()))
def test_reference_page_states_the_extra_it_needs(name, extra):
    head = (ROOT / "docs" / "api" / name).read_text().split("\n::: ")[0]
    assert '!!! note "Needs"' in head and f"pip install {extra}" in head, \
        f"docs/api/{name}: state `pip install {extra}` in a Needs note before the reference"
