"""Where mdl-jax keeps files between runs (shared by the controller's kernel cache and the pipeline)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE = "MDL_JAX_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$MDL_JAX_CACHE_DIR``, else ``~/.cache/mdl_jax``."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "mdl_jax")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: into a fresh name in the same folder (mkstemp:
    O_CREAT | O_EXCL, so a name planted beforehand is never followed), flushed, then renamed over
    ``path`` (a rename replaces a planted symlink itself, never its target)."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
