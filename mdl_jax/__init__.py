"""mdl-jax: the Memory Decision Layer as pure, jit/vmap-compiled JAX functions.

    from mdl_jax import decide
    d = decide(M=0.8, R=0.7, A=0.2)      # Decision(action, C, alpha, C_final, v_meta, energies, ...)

Importing this package loads JAX and NumPy only; signals, generation and experiments (which need
sentence-transformers / transformers / torch) live in modules that are imported on use.
"""

import os as _os


def _prefer_synchronous_cpu_dispatch() -> None:
    """Run CPU computations on the calling thread unless the user chose otherwise.

    With JAX's default asynchronous CPU dispatch, every non-trivial call hands its work to a worker
    thread and ``block_until_ready`` waits for the hand-back; on the 2-core dev VM that round trip costs
    ~45 µs, ten times a one-store signal aggregation. The controller is per-decision middleware, so we
    switch it off, but only when (a) JAX's CPU backend is not initialised yet (the setting is read once,
    then), (b) neither JAX_CPU_ENABLE_ASYNC_DISPATCH nor MDL_JAX_ASYNC_DISPATCH is set by the user.
    """
    if "JAX_CPU_ENABLE_ASYNC_DISPATCH" in _os.environ or _os.environ.get("MDL_JAX_ASYNC_DISPATCH"):
        return
    import jax
    from jax._src import xla_bridge

    if not getattr(xla_bridge, "_backends", None):
        jax.config.update("jax_cpu_enable_async_dispatch", False)


_prefer_synchronous_cpu_dispatch()

from mdl_jax.controller.api import checked_decide  # noqa: E402
from mdl_jax.controller.api import decide  # noqa: E402
from mdl_jax.controller.api import soft_decide  # noqa: E402
from mdl_jax.controller.calibration import Calibration  # noqa: E402
from mdl_jax.controller.calibration import calibrate  # noqa: E402
from mdl_jax.controller.config import MDLConfig  # noqa: E402
from mdl_jax.controller.decision import Action  # noqa: E402
from mdl_jax.controller.decision import Decision  # noqa: E402
from mdl_jax.controller.decision import decide_one  # noqa: E402
from mdl_jax.controller.decision import signal_cube_norm_range  # noqa: E402
from mdl_jax.controller.config_file import load_config  # noqa: E402
from mdl_jax.controller.config_file import save_config  # noqa: E402
from mdl_jax.controller.sweep import SweepResult  # noqa: E402
from mdl_jax.controller.sweep import bootstrap_weights  # noqa: E402
from mdl_jax.controller.sweep import config_grid  # noqa: E402
from mdl_jax.controller.sweep import stack_configs  # noqa: E402
from mdl_jax.controller.sweep import sweep  # noqa: E402
from mdl_jax.controller.stream import sweep_parquet  # noqa: E402
from mdl_jax.controller.tuning import TuneResult  # noqa: E402
from mdl_jax.controller.tuning import tune  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Action", "Calibration", "Decision", "MDLConfig", "SweepResult", "bootstrap_weights", "calibrate",
    "TuneResult", "checked_decide", "config_grid", "decide", "decide_one", "load_config", "save_config",
    "signal_cube_norm_range", "soft_decide", "stack_configs", "sweep", "sweep_parquet", "tune",
]
