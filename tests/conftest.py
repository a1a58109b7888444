"""Test-wide settings: every program the suite runs is verified by check_program."""
import os

os.environ.setdefault("TIGA_CHECK", "1")

import tiga  # noqa: E402

tiga.config.check = True
