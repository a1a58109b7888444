"""runtime: the tqdm bar of long-running storage work (ingest, transpose builds, paged runs)."""
from __future__ import annotations

from ..core.config import config


def progress_bar(total: int, desc: str, unit: str):
    """A tqdm bar, or None (tg.config.progress off, tqdm missing, or one step of work). The
    delay shows it only for work longer than about two seconds."""
    if not config.progress or total < 2:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, delay=2.0, leave=False)
