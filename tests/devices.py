"""Run a snippet in a fresh process that sees N forced CPU devices (for sharded = unsharded tests)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run_on_forced_devices(code: str, n_dev: int, tmp_path) -> np.ndarray:
    """Run ``code`` (which saves an array to ``sys.argv[1]`` and prints ``jax.device_count()`` last)
    with ``--xla_force_host_platform_device_count=n_dev``; return the saved array."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n_dev}",
           "JAX_PLATFORMS": "cpu"}
    path = Path(tmp_path) / f"out-{n_dev}.npy"
    p = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, check=True)
    assert p.stdout.strip().splitlines()[-1] == str(n_dev), p.stdout
    return np.load(path)
