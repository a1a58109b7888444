"""core: the error hierarchy every layer raises (API.md section 9)."""
from __future__ import annotations


class TigaError(Exception):
    """Base class of every error Tiga raises on purpose."""


class GraphValidationError(TigaError, ValueError):
    """A relation's arrays break a validation rule (names argument, position, rule)."""


class ShapeError(TigaError, ValueError):
    """Shapes of operands or fields do not agree."""


class DTypeError(TigaError, TypeError):
    """An operand has a dtype the operation does not accept."""


class UnsupportedError(TigaError, NotImplementedError):
    """A valid request that this route cannot serve; the message names the alternative."""

    def __init__(self, message: str, hint: str | None = None):
        self.hint = hint
        super().__init__(f"{message} (hint: {hint})" if hint else message)


class CompilationError(TigaError, RuntimeError):
    """Lowering or native compilation failed."""


class StorageError(TigaError, OSError):
    """A storage tier could not read, write or commit a value."""


class DistributedError(TigaError, RuntimeError):
    """A distributed plan or exchange failed."""


class FieldError(TigaError, AttributeError):
    """An edge or update function read a field the call did not provide."""


class ProgramError(TigaError, ValueError):
    """A GraphProgram is malformed (binding, single assignment or typing)."""


class TraceError(TigaError, TypeError):
    """A traced function did something that cannot be staged into a program."""
