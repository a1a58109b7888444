"""lower/ir: the text syntax every IR level shares: types, attribute values and a cursor.

Types reuse core's `TensorType` and `GraphType` so the IR converts back to a GraphProgram
exactly; only the task level adds opaque types (`!gf_storage.event`). Spelling:

    f32                      rank-0 tensor (a scalar row)      weak<f32>   Python-scalar origin
    tensor<Nx16xf32>         symbolic dims are upper-case names (N, S, E)
    !gf.relation<csr, src=S, dst=N, edges=E, index=i64>
"""
from __future__ import annotations

import json
import re

import numpy as np

from ...core import dtypes as dt
from ...core.errors import CompilationError
from ...core.records import record
from ...core.types import Dim, GraphType, TensorType

DTYPE_NAMES = {dt.bool_: "i1", dt.int8: "i8", dt.int16: "i16", dt.int32: "i32",
               dt.int64: "i64", dt.uint8: "ui8", dt.float16: "f16", dt.bfloat16: "bf16",
               dt.float32: "f32", dt.float64: "f64"}
NAME_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
_DTYPE_RE = r"(?:bf16|ui8|i1|i8|i16|i32|i64|f16|f32|f64)(?![A-Za-z0-9_])"
_DIM_RE = re.compile(r"[A-Z][A-Z0-9_]*\Z")
VALUE_NAME_RE = r"[A-Za-z0-9_.$]+"
IDENT_RE = r"[A-Za-z_][A-Za-z0-9_.]*"


@record
class OpaqueType:
    """A type with no payload, e.g. `!gf_storage.event` (a readiness event)."""

    name: str

    def __str__(self) -> str:
        return f"!{self.name}"


EVENT = OpaqueType("gf_storage.event")
OPAQUE_TYPES = {t.name: t for t in (EVENT,)}


@record
class SymbolRef:
    """`@name`: a reference to a symbol (a reducer, a function)."""

    name: str


@record
class RegionRef:
    """`#region<i>`: a parameter of a `gf_tensor` op that is its i-th region."""

    index: int


class AttrDict(tuple):
    """A dictionary attribute `{key = value, ...}` kept as an ordered tuple of pairs."""

    def get(self, key, default=None):
        return next((v for k, v in self if k == key), default)


# ---- printing ------------------------------------------------------------------------------

def format_dim(d) -> str:
    if isinstance(d, Dim):
        if not _DIM_RE.match(d.name):
            raise CompilationError(f"symbolic dim {d.name!r}: IR dims must be upper-case names "
                                   "such as N, S or E")
        return d.name
    return str(int(d))


def format_type(t) -> str:
    if isinstance(t, TensorType):
        name = DTYPE_NAMES[t.dtype]
        inner = (name if not t.shape else
            "tensor<" + "x".join([format_dim(d) for d in t.shape] + [name]) + ">")
        return f"weak<{inner}>" if t.weak else inner
    if isinstance(t, GraphType):
        edges = "?" if t.num_edges is None else format_dim(t.num_edges)
        coords = "" if t.coord_dims is None else f", coords={int(t.coord_dims)}"
        return (f"!gf.relation<{t.kind}, src={format_dim(t.num_src)}, "
                f"dst={format_dim(t.num_dst)}, edges={edges}, "
                f"index={DTYPE_NAMES[t.index_dtype]}{coords}>")
    if isinstance(t, OpaqueType):
        return str(t)
    raise CompilationError(f"{t!r} is not an IR type")


def format_attr(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dt.DType):
        return DTYPE_NAMES[v]
    if isinstance(v, Dim):
        return format_dim(v)
    if isinstance(v, SymbolRef):
        return f"@{v.name}"
    if isinstance(v, RegionRef):
        return f"#region<{v.index}>"
    if isinstance(v, AttrDict):
        return "{" + ", ".join(f"{k} = {format_attr(x)}" for k, x in v) + "}"
    if isinstance(v, tuple):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, (TensorType, GraphType, OpaqueType)):
        return format_type(v)
    raise CompilationError(f"{type(v).__name__} value {v!r} has no IR attribute form")


def to_attr(v):
    """Normalise a program parameter to an attribute value (tuples, Python scalars)."""
    if isinstance(v, np.ndarray):
        return to_attr(v.tolist())
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)) and not isinstance(v, AttrDict):
        return tuple(to_attr(x) for x in v)
    format_attr(v)  # raises for values without a text form
    return v


# ---- parsing -------------------------------------------------------------------------------

class Cursor:
    """A position in IR text with the few lexing helpers the recursive parser needs."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def ws(self) -> None:
        while True:
            m = re.compile(r"\s*(//[^\n]*)?").match(self.text, self.pos)
            if m.end() == self.pos:
                return
            self.pos = m.end()

    def at(self, s: str) -> bool:
        self.ws()
        return self.text.startswith(s, self.pos)

    def take(self, s: str) -> bool:
        if self.at(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.take(s):
            self.error(what or repr(s))

    def regex(self, pattern: str, what: str) -> str:
        self.ws()
        m = re.compile(pattern).match(self.text, self.pos)
        if not m:
            self.error(what)
        self.pos = m.end()
        return m.group(0)

    def try_regex(self, pattern: str) -> str | None:
        self.ws()
        m = re.compile(pattern).match(self.text, self.pos)
        if not m:
            return None
        self.pos = m.end()
        return m.group(0)

    def where(self, pos: int | None = None) -> str:
        pos = self.pos if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return f"line {line}, column {col}"

    def error(self, expected: str, pos: int | None = None):
        """Raise `IR parse error at line L, column C: expected <expected>, found '<text>'`."""
        pos = self.pos if pos is None else pos
        pos = re.compile(r"\s*").match(self.text, pos).end()
        found = self.text[pos:pos + 24].split("\n")[0] or "end of input"
        raise CompilationError(f"IR parse error at {self.where(pos)}: expected {expected}, "
                               f"found {found!r}")

    def done(self) -> bool:
        self.ws()
        return self.pos >= len(self.text)


def parse_dim(tok: str):
    return int(tok) if tok.isdigit() else Dim(tok)


def parse_type(cur: Cursor):
    if cur.take("weak<"):
        t = parse_type(cur)
        cur.expect(">")
        if not isinstance(t, TensorType):
            cur.error("weak<...> to wrap a tensor or scalar type")
        return t.update(weak=True)
    if cur.take("tensor<"):
        body = cur.regex(r"[^>]*", "tensor dims")
        cur.expect(">")
        parts = body.split("x")
        if len(parts) < 2 or parts[-1] not in NAME_DTYPES:
            cur.error("a tensor type like tensor<Nx16xf32> (rank-0 values are written as the "
                      "bare element type, e.g. f32)")
        dims = parts[:-1]
        if not all(d.isdigit() or _DIM_RE.match(d) for d in dims):
            cur.error(f"dims of {body!r} to be integers or upper-case names")
        return TensorType(tuple(parse_dim(d) for d in dims), NAME_DTYPES[parts[-1]])
    if cur.take("!gf.relation<"):
        return _parse_relation(cur)
    name = cur.try_regex(r"![a-z_]+\.[a-z_]+")
    if name is not None:
        if name[1:] not in OPAQUE_TYPES:
            cur.error(f"a known type, not {name}")
        return OPAQUE_TYPES[name[1:]]
    tok = cur.regex(_DTYPE_RE, "a type (f32, tensor<...>, !gf.relation<...>)")
    return TensorType((), NAME_DTYPES[tok])


def _parse_relation(cur: Cursor) -> GraphType:
    kind = cur.regex(r"[a-z_]+", "a relation kind")
    fields = {}
    while cur.take(","):
        key = cur.regex(r"[a-z]+", "a relation field")
        cur.expect("=")
        fields[key] = cur.regex(r"[A-Za-z0-9_?]+", f"a value for {key}")
    cur.expect(">")
    need = ["src", "dst", "edges", "index"]
    if [k for k in fields if k != "coords"] != need:
        cur.error(f"relation fields {', '.join(need)} (and optionally coords) in that order")
    if fields["index"] not in NAME_DTYPES:
        cur.error("an index dtype such as i32 or i64")
    edges = None if fields["edges"] == "?" else parse_dim(fields["edges"])
    coords = int(fields["coords"]) if "coords" in fields else None
    return GraphType(kind, parse_dim(fields["src"]), parse_dim(fields["dst"]), edges,
                     NAME_DTYPES[fields["index"]], coords)


_NUMBER_RE = r"-?(?:inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(?![A-Za-z0-9_])"


def parse_attr(cur: Cursor):
    cur.ws()
    if cur.at('"'):
        return parse_string(cur)
    if cur.take("["):
        return tuple(_comma_list(cur, "]", parse_attr))
    if cur.take("{"):
        return AttrDict(_comma_list(cur, "}", _parse_pair))
    if cur.take("@"):
        return SymbolRef(cur.regex(IDENT_RE, "a symbol name"))
    if cur.take("#region<"):
        index = int(cur.regex(r"\d+", "a region index"))
        cur.expect(">")
        return RegionRef(index)
    num = cur.try_regex(_NUMBER_RE)
    if num is not None:
        is_float = any(c in num for c in ".eE") or "inf" in num or "nan" in num
        return float(num) if is_float else int(num)
    word = cur.try_regex(r"(?:true|false|none)(?![A-Za-z0-9_])")
    if word is not None:
        return {"true": True, "false": False, "none": None}[word]
    dim = cur.try_regex(r"[A-Z][A-Z0-9_]*(?![A-Za-z0-9_])")
    if dim is not None:
        return Dim(dim)
    name = cur.try_regex(_DTYPE_RE)
    if name is not None:  # a bare element type is a dtype (`new_dtype = f64`)
        return NAME_DTYPES[name]
    return parse_type(cur)


def parse_string(cur: Cursor) -> str:
    pos = cur.pos
    raw = cur.regex(r'"(?:[^"\\\n]|\\.)*"', "a string literal on one line")
    try:
        return json.loads(raw)
    except ValueError:
        cur.error("a valid string literal", pos)


def _parse_pair(cur: Cursor):
    key = cur.regex(IDENT_RE, "an attribute name")
    cur.expect("=")
    return (key, parse_attr(cur))


def _comma_list(cur: Cursor, close: str, item) -> list:
    out = []
    if cur.take(close):
        return out
    while True:
        out.append(item(cur))
        if cur.take(close):
            return out
        cur.expect(",", f"',' or {close!r}")


def parse_attr_dict(cur: Cursor) -> tuple:
    """`{k = v, ...}` as an ordered tuple of pairs; duplicate keys are an error."""
    start = cur.pos
    cur.expect("{")
    pairs = _comma_list(cur, "}", _parse_pair)
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            cur.error(f"attribute {k!r} to appear once", start)
    return tuple(pairs)
