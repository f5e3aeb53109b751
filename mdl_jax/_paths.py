"""Where mdl-jax keeps files between runs (shared by the controller's kernel cache and the pipeline)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE = "MDL_JAX_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$MDL_JAX_CACHE_DIR``, else ``~/.cache/mdl_jax``."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "mdl_jax")
