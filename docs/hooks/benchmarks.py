"""mkdocs hook for `make docs`: the benchmark reports and plots join the site.

The guide links them where they live in the repository (`../../benchmarks/...` from
docs/guide/), so the links also work when the Markdown is read on its own. mkdocs only
publishes files under docs/, so this hook adds benchmarks/*.md and benchmarks/plots/*.png
to the site under `benchmarks/` and rewrites those links to point there.
"""
from __future__ import annotations

import os
import posixpath
import re

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")
LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def on_files(files, config):
    for rel in sorted(os.listdir(BENCH)):
        if rel.endswith(".md"):
            _add(files, config, rel)
    for rel in sorted(os.listdir(os.path.join(BENCH, "plots"))):
        if rel.endswith(".png"):
            _add(files, config, f"plots/{rel}")
    return files


def _add(files, config, rel: str) -> None:
    files.append(File.generated(config, f"benchmarks/{rel}",
                                abs_src_path=os.path.join(BENCH, rel)))


def on_page_markdown(markdown, page, config, files):
    """Links from docs/ pages into ../benchmarks/ point at the copies the site holds."""
    if page.file.abs_src_path is None or not page.file.abs_src_path.startswith(
            os.path.join(ROOT, "docs") + os.sep):
        return markdown
    here = posixpath.dirname(page.file.src_uri)
    real_dir = posixpath.join("docs", here)

    def fix(m):
        target = posixpath.normpath(posixpath.join(real_dir, m.group(2)))
        if not target.startswith("benchmarks/"):
            return m.group(0)
        return m.group(1) + posixpath.relpath(target, here or ".") + m.group(3)

    return LINK.sub(fix, markdown)
