"""Peak resident memory of a call, measured in a fresh interpreter: the memory-bound tests of the
calibration (tests/test_calibration.py) and the sweep (tests/test_sweep.py) run their call under test in a
child process, so the growth measured is that call's alone, not this test session's heap."""

import os
import subprocess
import sys
import textwrap

from tests.xla_cache import without_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def peak_growth_mb(script: str, *args) -> float:
    """Run ``script`` in a fresh interpreter; it prints the growth of its peak RSS (MB) on the last
    line, measured around the call under test after a warm-up (compilation) call."""
    env = dict(without_cache(os.environ), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


PEAK_RSS_FUNCS = """
    def reset_peak():
        # the peak RSS (VmHWM) reset to the current RSS (Linux: clear_refs 5), so the growth measured
        # is the call's own, not a peak left by the set-up
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return hwm()

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
"""
