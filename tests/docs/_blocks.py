"""Python code blocks of the Markdown docs: extraction, chaining and output checks.

A fenced ```python block may be preceded by HTML comment markers (one per line, directly
above the fence):

    <!-- continue -->        runs after the previous block of the same file, in one process
    <!-- mpi 2 -->           the chain runs under `mpiexec -n 2` (on the chain's first block)
    <!-- skip: <reason> -->  not run; the reason is required
    <!-- requires: triton --> skipped (saying so) where that module is not installed

A `print(...)` statement whose last line ends in a comment states its output: `print(y)  #
[23. 6. 0.]`. Printed text and comment are compared token by token (numbers as numbers, so
`6.` equals `6.0`; whitespace is ignored; `...` in the comment matches any run of tokens).
"""
from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

MARKER = re.compile(r"^<!--\s*(continue|mpi\s+(\d+)|skip:\s*(.*?)|requires:\s*([\w.]+))"
                    r"\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
MARK_FN = "__tiga_doc_mark__"
MARK_LINE = "@@tiga-doc-mark@@ "


@dataclass
class Block:
    path: Path
    line: int                       # 1-based line of the opening fence
    source: str
    markers: list = field(default_factory=list)

    def marker(self, name: str):
        for m in self.markers:
            if m[0] == name:
                return m
        return None


@dataclass
class Chain:
    """Blocks run in one process, in order: a block and the `continue` blocks after it."""
    blocks: list
    ranks: int = 0                  # 0: a plain process; N: mpiexec -n N
    skip: str | None = None

    @property
    def name(self) -> str:
        return f"{self.blocks[0].path.name}:{self.blocks[0].line}"


def _marker(text: str):
    m = MARKER.match(text.strip())
    if m is None:
        return None
    if m.group(1) == "continue":
        return ("continue",)
    if m.group(2):
        return ("mpi", int(m.group(2)))
    if m.group(4):
        return ("requires", m.group(4))
    return ("skip", m.group(3))


def python_blocks(path: Path) -> list:
    """Every ```python block of a Markdown file, with the markers right above its fence."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, lang, start = len(m.group(1)), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i][indent:])
            i += 1
        i += 1
        if lang != "python":
            continue
        markers, j = [], start - 1
        while j >= 0 and _marker(lines[j]) is not None:
            markers.insert(0, _marker(lines[j]))
            j -= 1
        blocks.append(Block(path, start + 1, "\n".join(body) + "\n", markers))
    return blocks


def chains(blocks: list) -> list:
    """Group one file's blocks into chains; a `continue` block with nothing before it, or a
    skip marker without a reason, is an error of the docs."""
    out: list = []
    for b in blocks:
        skip = b.marker("skip")
        if skip is not None and not skip[1]:
            raise ValueError(f"{b.path}:{b.line}: a skip marker needs a reason")
        if b.marker("continue"):
            if not out:
                raise ValueError(f"{b.path}:{b.line}: `continue` with no block before it")
            out[-1].blocks.append(b)
            if skip:
                out[-1].skip = skip[1]
            continue
        mpi = b.marker("mpi")
        out.append(Chain([b], ranks=mpi[1] if mpi else 0, skip=skip[1] if skip else None))
    return out


# ---------------------------------------------------------------- instrumentation
def _comments(source: str) -> dict:
    """line number -> the text of the comment ending that line."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string[1:].strip()
    return out


def _checked_prints(source: str) -> list:
    """(first line, last line, column, expected text) of each print statement with an
    output comment on its last line."""
    comments = _comments(source)
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "print"
                and node.end_lineno in comments):
            out.append((node.lineno, node.end_lineno, node.col_offset,
                        comments[node.end_lineno]))
    return out


def instrument(source: str, tag: str) -> tuple[str, dict]:
    """`source` with a mark printed before and after each checked print; returns it and
    mark id -> expected text."""
    lines = source.splitlines()
    expected, inserts = {}, []
    for n, (first, last, col, text) in enumerate(_checked_prints(source)):
        line = lines[first - 1]
        if line[:col].strip():
            raise ValueError(f"{tag}: a checked print must start its line: {line!r}")
        mark_id = f"{tag}#{n}"
        expected[mark_id] = text
        inserts += [(first - 1, f"{line[:col]}{MARK_FN}({mark_id!r})"),
                    (last, f"{line[:col]}{MARK_FN}(None)")]
    # from the end, and at one position the later insert first: print A's end mark then
    # print B's start mark when B follows A on the next line
    for _, (pos, text) in sorted(enumerate(inserts), key=lambda p: (p[1][0], p[0]),
                                 reverse=True):
        lines.insert(pos, text)
    return "\n".join(lines) + "\n", expected


def prologue() -> str:
    """Defines the mark function (writes a sentinel line to stdout)."""
    return (f"def {MARK_FN}(mark):\n"
            f"    import sys as _s\n"
            f"    _s.stdout.flush()\n"
            f"    _s.stdout.write({MARK_LINE!r} + str(mark) + '\\n')\n"
            f"    _s.stdout.flush()\n")


def segments(stdout: str) -> dict:
    """mark id -> the list of texts printed between that mark and the next end mark."""
    out: dict = {}
    current, buf = None, []
    for line in stdout.splitlines(keepends=True):
        if line.startswith(MARK_LINE):
            mark = line[len(MARK_LINE):].strip()
            if current is not None:
                out.setdefault(current, []).append("".join(buf))
            current, buf = (None if mark == "None" else mark), []
        elif current is not None:
            buf.append(line)
    return out


# ---------------------------------------------------------------- comparison
TOKEN = re.compile(r"\.\.\.|[A-Za-z_][A-Za-z_0-9]*|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
                   r"|\S")


def _tokens(text: str) -> list:
    return TOKEN.findall(text)


def _same(a: str, b: str) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return a == b
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12)


def matches(printed: str, expected: str) -> bool:
    """Token match of `printed` against `expected`, where `...` matches any tokens."""
    got, want = _tokens(printed), _tokens(expected)
    # ok[i]: got[i:] matches want[j:], filled for j from the end (wildcard matching)
    ok = [i == len(got) for i in range(len(got) + 1)]
    for j in range(len(want) - 1, -1, -1):
        new = [False] * (len(got) + 1)
        for i in range(len(got), -1, -1):
            if want[j] == "...":
                new[i] = ok[i] or (i < len(got) and new[i + 1])
            else:
                new[i] = i < len(got) and _same(got[i], want[j]) and ok[i + 1]
        ok = new
    return ok[0]
