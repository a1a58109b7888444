"""Peak-RSS probe for the memory tests' child processes: its source is prepended to the script
each test runs in a subprocess (`PROBE`), so every test measures the same way.

`peak_growth(fn)` returns (fn(), bytes the peak RSS grew by while fn ran): the peak is reset
to the current RSS through /proc/self/clear_refs (Linux), so the growth is that call's alone;
where the reset is refused, the growth is measured against the peak so far."""
from pathlib import Path


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/self/status has no {key}")


def peak_growth(fn):
    try:
        with open("/proc/self/clear_refs", "w") as f:    # the peak restarts at the current RSS
            f.write("5")
        base = status("VmRSS:")
    except OSError:
        base = status("VmHWM:")
    out = fn()
    return out, status("VmHWM:") - base


# (read as text: the child processes run it as part of their script)
PROBE = Path(__file__).read_text() if "__file__" in globals() else ""
