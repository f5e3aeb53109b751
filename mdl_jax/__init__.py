"""mdl-jax: the Memory Decision Layer as pure, jit/vmap-compiled JAX functions.

    from mdl_jax import decide
    d = decide(M=0.8, R=0.7, A=0.2)      # Decision(action, C, alpha, C_final, v_meta, energies, ...)

Importing this package loads JAX and NumPy only and changes no JAX setting; signals, generation and
experiments (which need sentence-transformers / transformers / torch) live in modules that are
imported on use. Faster engines (``mdl_jax.engines``) load when a call names one. Synchronous CPU
dispatch, which per-decision callers want, is ``mdl_jax.runtime.synchronous_cpu_dispatch()``.
"""

from mdl_jax._version import __version__ as __version__
from mdl_jax.controller.api import checked_decide, decide, soft_decide
from mdl_jax.controller.calibration import Calibration, calibrate
from mdl_jax.controller.config import MDLConfig
from mdl_jax.controller.config_file import load_config, save_config
from mdl_jax.controller.decision import Action, Decision, decide_one, signal_cube_norm_range
from mdl_jax.controller.stream import sweep_parquet
from mdl_jax.controller.sweep import SweepResult, bootstrap_weights, config_grid, stack_configs, sweep
from mdl_jax.controller.tuning import TuneResult, tune

__all__ = [
    "Action",
    "Calibration",
    "Decision",
    "MDLConfig",
    "SweepResult",
    "TuneResult",
    "bootstrap_weights",
    "calibrate",
    "checked_decide",
    "config_grid",
    "decide",
    "decide_one",
    "load_config",
    "save_config",
    "signal_cube_norm_range",
    "soft_decide",
    "stack_configs",
    "sweep",
    "sweep_parquet",
    "tune",
]
