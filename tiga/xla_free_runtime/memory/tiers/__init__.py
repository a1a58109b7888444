"""runtime: storage tiers behind tg.Tensor (alloc / read / write / view / release)."""
from .base import Storage  # noqa: F401
from .disk import DiskStorage  # noqa: F401
from .host import HostStorage  # noqa: F401
