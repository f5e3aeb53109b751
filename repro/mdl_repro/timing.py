"""Timing helpers shared by the controller's latency table (analysis) and the pipeline's stage timings."""

from __future__ import annotations

import time

import numpy as np


def time_calls(fn, args_list, passes: int = 2) -> np.ndarray:
    """µs per call of fn(*args) (block_until_ready), the last pass."""
    import jax

    out = np.zeros(len(args_list))
    for _ in range(passes):
        for i, args in enumerate(args_list):
            t0 = time.perf_counter_ns()
            jax.block_until_ready(fn(*args))
            out[i] = (time.perf_counter_ns() - t0) / 1e3
    return out


def summary(us: np.ndarray) -> dict:
    """Median, p99, mean (µs) and count of a vector of timings."""
    return {"median": float(np.median(us)), "p99": float(np.percentile(us, 99)), "mean": float(np.mean(us)),
            "n": int(len(us))}
