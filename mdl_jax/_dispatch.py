"""Imported first by ``mdl_jax/__init__.py``, before JAX's CPU backend starts: it chooses the CPU dispatch
mode, which JAX reads once, when the backend is created."""

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
