"""runtime: the tqdm bar of long-running storage work (ingest, transpose builds, paged runs)."""
from __future__ import annotations

import sys

from ...core.config import config

DELAY_S = 2.0       # a bar shows only once its work has taken this long


def progress_bar(total: int, desc: str, unit: str):
    """A tqdm bar on stderr, or None (tg.config.progress off, tqdm missing, or one step of
    work). It shows only for work longer than DELAY_S; once shown it stays on screen when
    closed, with its last count (total/total when the work finished)."""
    if not config.progress or total < 2:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    # (leave=True: close() redraws the final count; a bar erased on close, or left at the
    # count of its last rate-limited refresh, read as work that stopped short)
    return tqdm(total=total, desc=desc, unit=unit, delay=DELAY_S, leave=True, file=sys.stderr,
                dynamic_ncols=True)
