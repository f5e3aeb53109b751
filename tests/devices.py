"""Run a snippet in a fresh process that sees N forced CPU devices (for sharded = unsharded tests)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests import xla_cache

ROOT = Path(__file__).resolve().parents[1]


def run_on_forced_devices(code: str, n_dev: int, tmp_path) -> np.ndarray:
    """Run ``code`` (which saves an array to ``sys.argv[1]`` and prints ``jax.device_count()`` last)
    with ``--xla_force_host_platform_device_count=n_dev``; return the saved array."""
    # Without the suite's persistent XLA cache (tests/xla_cache.py): the product never loads a multi-device
    # executable from one, and once (in 1 of 2 full runs on a Zen 4 VM, 2026-12-03) this child died of a
    # SIGABRT with the cache warm, never reproduced in 17 reruns with it warm; compiling costs ~8 s more here.
    env = {**xla_cache.without_cache(os.environ), "XLA_FLAGS": f"--xla_force_host_platform_device_count={n_dev}",
           "JAX_PLATFORMS": "cpu"}
    path = Path(tmp_path) / f"out-{n_dev}.npy"
    p = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=False)
    # the child's stderr in the failure: a bare CalledProcessError (a SIGABRT, say) says nothing of why
    assert p.returncode == 0, f"exit {p.returncode}:\n{p.stderr[-4000:]}"
    assert p.stdout.strip().splitlines()[-1] == str(n_dev), p.stdout
    return np.load(path)
