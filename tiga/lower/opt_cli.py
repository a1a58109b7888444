"""lower: `tiga-opt FILE [passes...]`: read IR text of any level, run passes in order, print.

Pass flags: --lower-domain-to-iter --lower-iter-to-kernel --select-kernel-schedule
--plan-distributed-tasks, or the report's spellings (-gf-lower-domain-to-iter, ...).
`--render` prints the LLVM text of a scheduled kernel-level module instead (after the
passes). FILE may be `-` for standard input. Errors print one message and exit with status 1.
"""
from __future__ import annotations

import sys

from ..core.errors import TigaError, UnsupportedError
from .ir import parse_module
from .passes import PASSES

USAGE = ("usage: tiga-opt FILE [" + "] [".join(f"--{p}" for p in PASSES) + "] [--render]\n"
         "  reads IR text of any level (domain, iter, kernel, task), runs the passes in the\n"
         "  order given and prints the result; -gf-<pass> spellings are accepted too.")


def _pass_name(flag: str) -> str | None:
    """`--lower-domain-to-iter`, `-gf-lower-domain-to-iter`, `--gf-...` -> the pass name."""
    name = flag.lstrip("-")
    if name.startswith("gf-"):
        name = name[3:]
    return name if name in PASSES else None


def _parse_args(argv: list) -> tuple:
    files, passes = [], []
    for arg in argv:
        if arg == "--render":
            passes.append(arg)
        elif arg.startswith("-") and arg != "-":
            name = _pass_name(arg)
            if name is None:
                raise TigaError(f"unknown option {arg!r}; passes: "
                                f"{', '.join('--' + p for p in PASSES)}")
            passes.append(name)
        else:
            files.append(arg)
    if len(files) != 1:
        raise TigaError(f"expected one input FILE (or - for stdin), found {len(files)}")
    return files[0], passes


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        path, passes = _parse_args(argv)
        module = parse_module(_read(path))
        module.verify()
        render = "--render" in passes
        for name in passes:
            if name != "--render":
                module = PASSES[name](module)
        if render:
            sys.stdout.write(_render(module))
        else:
            sys.stdout.write(str(module))
    except (TigaError, OSError) as exc:
        print(f"tiga-opt: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _render(module) -> str:
    from . import CPU_LLVM_AVAILABLE

    if not CPU_LLVM_AVAILABLE:
        raise UnsupportedError("--render needs llvmlite (the cpu-llvm backend)")
    from .llvm.render import render_kernel_module
    return render_kernel_module(module)


if __name__ == "__main__":
    sys.exit(main())
