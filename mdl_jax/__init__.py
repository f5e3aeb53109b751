"""mdl-jax: the Memory Decision Layer as pure, jit/vmap-compiled JAX functions.

    from mdl_jax import decide
    d = decide(M=0.8, R=0.7, A=0.2)      # Decision(action, C, alpha, C_final, v_meta, energies, ...)

Importing this package loads JAX and NumPy only; signals, generation and experiments (which need
sentence-transformers / transformers / torch) live in modules that are imported on use.
"""

from mdl_jax.api import checked_decide
from mdl_jax.api import decide
from mdl_jax.api import soft_decide
from mdl_jax.calibration import Calibration
from mdl_jax.calibration import calibrate
from mdl_jax.config import MDLConfig
from mdl_jax.decision import Action
from mdl_jax.decision import Decision
from mdl_jax.decision import decide_one
from mdl_jax.decision import signal_cube_norm_range

__version__ = "0.1.0"

__all__ = [
    "Action", "Calibration", "Decision", "MDLConfig", "calibrate", "checked_decide", "decide",
    "decide_one", "signal_cube_norm_range", "soft_decide",
]
