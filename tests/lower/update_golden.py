"""Regenerate (or check) the golden IR files of tests/lower/golden/: the WeightedSum fixture of
test_ir.py printed at each level. The tests only compare against these files and never write
them, so a printer change shows as a failing test until someone regenerates them on purpose:

    python tests/lower/update_golden.py --update   # (or `make golden`) rewrite the files
    python tests/lower/update_golden.py            # exit 1 and list the files that differ

Review `git diff tests/lower/golden` before committing the new text."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# as the tests' autouse fixture: the schedule records the thread count, the text must not
# depend on the machine, and a TIGA_DUMP in the environment must not print into it
os.environ["TIGA_NUM_THREADS"] = "2"
os.environ.pop("TIGA_DUMP", None)
sys.path.insert(0, str(Path(__file__).parent))

from test_ir import GOLDEN, LEVELS, WeightedSum, fixture_kwargs  # noqa: E402


def render(level: str) -> str:
    return WeightedSum().ir(level, **fixture_kwargs())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="rewrite the golden files")
    args = ap.parse_args(argv)
    stale = []
    for level in LEVELS:
        path, text = GOLDEN / f"{level}.mlir", render(level)
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if args.update:
            path.write_text(text)
            print(f"rewrote {path}")
        else:
            print(f"differs from the printer: {path} (regenerate: make golden)")
    if not stale:
        print("golden files match the printer")
    return 1 if stale and not args.update else 0


if __name__ == "__main__":
    sys.exit(main())
