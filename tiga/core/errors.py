"""core: the error hierarchy every layer raises (API.md section 9)."""
from __future__ import annotations

# where the reference documents each error (docs/api/errors.md, one entry per class). The
# docs have no published site URL, so a note names what every user can follow: help() on
# the class (its docstring is the entry's text, "What to do" included), then the page's path
# in the source tree, whose #tiga.<Name> anchor is the entry in the site `make docs` builds.
ERRORS_PAGE = "docs/api/errors.md"


def errors_note(name: str) -> str:
    """The note that ends the traceback of a Tiga error documented as `tg.<name>`."""
    return (f"See help(tg.{name}), or its entry in the errors reference: "
            f"{ERRORS_PAGE}#tiga.{name}")


class TigaError(Exception):
    """Base class of every error Tiga raises on purpose.

    What to do: catch `tg.TigaError` to handle every one of them; the subclass and its
    message say what was wrong and what to change. A traceback ends with a note naming
    the error's entry in the errors reference: `help(tg.<Name>)` prints it anywhere,
    and `docs/api/errors.md#tiga.<Name>` is the same entry in the docs (`err.__notes__`;
    `str(err)` is the message alone).
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.add_note(errors_note(documented_name(type(self))))


def documented_name(cls: type) -> str:
    """The exported error class whose entry documents `cls`: itself, or the nearest
    base defined beside the documented ones (an internal signal such as a code
    generator's UnsupportedError subclass points at tg.UnsupportedError)."""
    for c in cls.__mro__:
        if (c.__module__ in ("tiga.core.errors", "tiga.core.config")
                and not c.__name__.startswith("_")):
            return c.__name__
    return "TigaError"


class GraphValidationError(TigaError, ValueError):
    """A relation's arrays break a validation rule (names argument, position, rule).

    What to do: fix the array at the position the message names (an index out of range, a
    row_ptr that decreases, mismatched lengths), or build the relation from clean data.
    """


class ShapeError(TigaError, ValueError):
    """Shapes of operands or fields do not agree.

    What to do: give every node field num_src (or num_dst) rows and every edge field
    num_edges rows; the message names the field, the shape expected and the one found.
    """


class DTypeError(TigaError, TypeError):
    """An operand has a dtype the operation does not accept.

    What to do: cast the operand (`x.astype("float32")`) to a dtype the message lists.
    """


class UnsupportedError(TigaError, NotImplementedError):
    """A valid request that this route cannot serve; the message names the alternative.

    What to do: follow the hint (`err.hint`), which names the supported route or call.
    """

    def __init__(self, message: str, hint: str | None = None):
        self.hint = hint
        super().__init__(f"{message} (hint: {hint})" if hint else message)


class CompilationError(TigaError, RuntimeError):
    """Lowering or native compilation failed.

    What to do: a bug in Tiga, not in your program: report it with the message; meanwhile
    `MessagePassing.reference(...)` runs the same call on the reference interpreter.
    """


class StorageError(TigaError, OSError):
    """A storage tier could not read, write or commit a value.

    What to do: check the file or directory the message names (free space, permissions,
    a damaged or partly written store); a store that fails its checksum must be written
    again.
    """


class DistributedError(TigaError, RuntimeError):
    """A distributed plan or exchange failed.

    What to do: make every rank make the same calls with agreeing partitions; a timeout
    names the rank waited on (raise TIGA_DIST_TIMEOUT for slow ranks).
    """


class FieldError(TigaError, AttributeError):
    """An edge or update function read a field the call did not provide.

    What to do: pass the field the message names (`src={...}`, `dst={...}`,
    `edge={...}`), or correct its name in the function.
    """


class ProgramError(TigaError, ValueError):
    """A GraphProgram is malformed (binding, single assignment or typing).

    What to do: programs made with tg.make_program or tg.jit are well formed; a program
    built or edited by hand must bind each name once and match the types the message names.
    """


class TraceError(TigaError, TypeError):
    """A traced function did something that cannot be staged into a program.

    What to do: replace Python control flow on traced values (`if x > 0`, `float(x)`)
    with tg.math.where, tg.repeat or tg.while_loop; see the sharp bits page.
    """


class RequiresGradError(TraceError):
    """A torch tensor that requires grad was passed to tg.jit, tg.grad or another Tiga
    transformation. Such a tensor belongs to torch.autograd, which Tiga's own tracer
    cannot differentiate through.

    What to do: call the propagate or layer directly, outside tg.jit / tg.grad, and use
    torch's `.backward()` (Tiga's compiled backward runs inside it); or pass
    `x.detach()` (or a numpy array) to differentiate with tg.grad instead.
    """


class LayerArgumentError(TigaError, ValueError):
    """A tg.nn layer (or NeighborLoader, or an aggregation) got a constructor or forward
    argument it cannot accept; the message names the layer, the argument, what was
    expected and what was found. A ValueError, as PyG raises for the same arguments.

    What to do: pass the argument as the message says (PyG's conventions); a cached layer
    (`cached=True`) called with another graph needs `reset_parameters()` or `cached=False`.
    """
