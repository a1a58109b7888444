"""mkdocs hook for `make docs`: the benchmark reports and plots, the example scripts and
the changelog join the site.

The guide links them where they live in the repository (`../../benchmarks/...` or
`../../examples/pagerank.py` from docs/guide/, `../CHANGELOG.md` from docs/), so the links
also work when the Markdown is read on its own. mkdocs only publishes files under docs/,
so this hook adds benchmarks/*.md, benchmarks/plots/*.png, examples/*.py and CHANGELOG.md
to the site under the same paths and rewrites those links to point there.
"""
from __future__ import annotations

import os
import posixpath
import re

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")
EXAMPLES = os.path.join(ROOT, "examples")
# repository paths (a folder ends in "/") whose links from docs/ pages point at the copies
PUBLISHED = ("benchmarks/", "examples/", "CHANGELOG.md")
LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def on_files(files, config):
    for rel in sorted(os.listdir(BENCH)):
        if rel.endswith(".md"):
            _add(files, config, rel)
    for rel in sorted(os.listdir(os.path.join(BENCH, "plots"))):
        if rel.endswith(".png"):
            _add(files, config, f"plots/{rel}")
    for rel in sorted(os.listdir(EXAMPLES)):
        if rel.endswith(".py"):
            files.append(File.generated(config, f"examples/{rel}",
                                        abs_src_path=os.path.join(EXAMPLES, rel)))
    if os.path.exists(os.path.join(ROOT, "CHANGELOG.md")):
        files.append(File.generated(config, "CHANGELOG.md",
                                    abs_src_path=os.path.join(ROOT, "CHANGELOG.md")))
    return files


def _add(files, config, rel: str) -> None:
    files.append(File.generated(config, f"benchmarks/{rel}",
                                abs_src_path=os.path.join(BENCH, rel)))


def on_page_markdown(markdown, page, config, files):
    """Links from docs/ pages into ../benchmarks/, ../examples/ and to ../CHANGELOG.md
    point at the copies the site holds."""
    if page.file.abs_src_path is None or not page.file.abs_src_path.startswith(
            os.path.join(ROOT, "docs") + os.sep):
        return markdown
    here = posixpath.dirname(page.file.src_uri)
    real_dir = posixpath.join("docs", here)

    def fix(m):
        target = posixpath.normpath(posixpath.join(real_dir, m.group(2)))
        if not (target.startswith(PUBLISHED[:2]) or target == PUBLISHED[2]):
            return m.group(0)
        return m.group(1) + posixpath.relpath(target, here or ".") + m.group(3)

    return LINK.sub(fix, markdown)
