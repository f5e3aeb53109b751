"""XLA's persistent compilation cache for the test suite: ``<default cache>/xla-tests/<host key>``.

Compiling is most of the controller tests' CPU (test_decision + test_tuning: 90 of 125 s was XLA's
backend compile, 632 programs), and a second run on the same machine (or the ``mdl-jax`` processes
the tests start, or the other pytest-xdist worker) compiles many of the same programs again. With this
cache, a rerun loads them instead.

Only programs that took at least ``MIN_COMPILE_S`` to compile are stored: 71 of the 797 programs of
test_decision, test_tuning and test_api, and 65% of their compile time. Storing every program cost
~9 ms of serialising and writing each, 12% on top of a cold run's compile time; storing these costs
~1%. A fresh clone's first run is cold, so no faster; a rerun skips most of the compiling.

Entries are keyed by XLA on the program, the jax/jaxlib version, the flags and the device. The folder
name adds the host CPU's model and flags, because XLA's CPU code is built for the host's ISA and a home
folder can be shared between machines.

Bounded: at most ``MAX_BYTES``, least recently used evicted first. Eviction also makes XLA take a file
lock around every read and write, so concurrent processes never read a half-written entry.

``MDL_JAX_TEST_XLA_CACHE=0`` turns it off, for a run that compiles everything itself; a
``JAX_COMPILATION_CACHE_DIR`` already set is left as it is (the caller's own cache). The tests that
measure a process's memory start it with ``without_cache(os.environ)``: storing an executable costs
memory that the product does not spend.
"""

import hashlib
import os
import platform
from pathlib import Path

import jax

MIN_COMPILE_S = 0.1
MAX_BYTES = 2 << 30
_OPTIONS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes", "jax_compilation_cache_max_size")


def folder() -> Path:
    """This host's cache folder (not created)."""
    from mdl_jax._paths import default_cache_dir

    host = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            host += "".join(sorted({ln for ln in f if ln.startswith(("model name", "flags"))}))
    except OSError:
        host += platform.processor()
    key = hashlib.sha256(f"{host}|{jax.__version__}".encode()).hexdigest()[:16]
    return default_cache_dir() / "xla-tests" / key


def enable() -> None:
    """Turn the cache on in this process (whose jax is imported, nothing compiled yet) and, through the
    environment, in the processes it starts (the tests copy ``os.environ``)."""
    if os.environ.get("MDL_JAX_TEST_XLA_CACHE", "1") == "0" or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return  # off, or the caller's own cache (its settings reach jax and the processes as they are)
    path = folder()
    path.mkdir(parents=True, exist_ok=True)
    for name, value in zip(_OPTIONS, (str(path), MIN_COMPILE_S, 0, MAX_BYTES)):
        os.environ[name.upper()] = str(value)
        jax.config.update(name, value)


def without_cache(env) -> dict:
    """``env`` without the cache's variables: a process started with it compiles everything itself."""
    drop = {name.upper() for name in _OPTIONS}
    return {k: v for k, v in env.items() if k not in drop}
