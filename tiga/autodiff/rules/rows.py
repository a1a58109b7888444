"""autodiff: the row types an edge function sees for operands of given field roles."""
from __future__ import annotations

from ...core.prims.graph import row_type
from ...trace.math import _typeof


def row_types(values, roles) -> list:
    """A field's row (its leading entity axis dropped); a parameter whole."""
    return [row_type(_typeof(v)) if r != "param" else _typeof(v).strong()
            for v, r in zip(values, roles)]
