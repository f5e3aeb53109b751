"""Process-wide JAX settings that mdl-jax applies only when asked: nothing here runs on ``import mdl_jax``.

``synchronous_cpu_dispatch()`` runs JAX's CPU computations on the calling thread. With JAX's default
asynchronous CPU dispatch, every call hands its work to a worker thread and waiting for the result
waits for the hand-back, a fixed cost that dominates a per-decision call of the controller. The
command line (``mdl-jax``) and the servers call it first thing; a program of your own that makes many
small calls can do the same, before it runs anything on JAX's CPU backend::

    import mdl_jax.runtime
    mdl_jax.runtime.synchronous_cpu_dispatch()

or, around the start of a program (the setting stays for the life of the process)::

    with mdl_jax.runtime.synchronous_cpu_dispatch():
        main()
"""

from __future__ import annotations

import contextlib
import os
import warnings

# The environment variables by which a user keeps JAX's asynchronous CPU dispatch: JAX's own
# setting, and the older switch of this package (deprecated; setting JAX's is enough).
_USER_CHOICES = ("JAX_CPU_ENABLE_ASYNC_DISPATCH", "MDL_JAX_ASYNC_DISPATCH")


def _cpu_backend_started() -> bool:
    from jax._src import xla_bridge

    return bool(getattr(xla_bridge, "_backends", None))


class _Applied(contextlib.ContextDecorator):
    """What ``synchronous_cpu_dispatch`` returns: truthy when the setting was applied, and usable as a
    context manager (entering and leaving it changes nothing more: JAX reads the setting once)."""

    def __init__(self, applied: bool):
        self.applied = applied

    def __bool__(self) -> bool:
        return self.applied

    def __repr__(self) -> str:
        return f"synchronous_cpu_dispatch(applied={self.applied})"

    def __enter__(self) -> _Applied:
        return self

    def __exit__(self, *exc) -> None:
        return None


def synchronous_cpu_dispatch(*, warn_if_late: bool = True) -> _Applied:
    """Make JAX run CPU computations on the calling thread, for the rest of the process.

    JAX reads this setting once, when its CPU backend starts (the first computation, or the first
    question about devices), so call it before that. A user's own choice wins: with
    ``JAX_CPU_ENABLE_ASYNC_DISPATCH`` set (or the deprecated ``MDL_JAX_ASYNC_DISPATCH`` set to a
    non-empty value), nothing changes.

    Examples:
      >>> import mdl_jax.runtime
      >>> mdl_jax.runtime.synchronous_cpu_dispatch()      # doctest: +SKIP

    Args:
      warn_if_late: warn when the call comes too late to take effect (True); False for callers that
        ask for it on the chance that they come first (the command line's ``main``, which tests and
        programs also call after JAX has started).

    Returns:
      An object that is true when the setting was applied (false when the user's environment chose,
      or when it came too late), and that is also a context manager for ``with`` at a program's start.

    Warns:
      RuntimeWarning: JAX's CPU backend has started already, with asynchronous dispatch on: the call
        is too late to change it, and says so (unless ``warn_if_late`` is False).
    """
    if _USER_CHOICES[0] in os.environ or os.environ.get(_USER_CHOICES[1]):
        return _Applied(False)
    import jax

    if jax.config.values.get("jax_cpu_enable_async_dispatch") is False:
        return _Applied(True)   # already synchronous (an earlier call, or the user's own jax.config)
    if _cpu_backend_started():
        if not warn_if_late:
            return _Applied(False)
        warnings.warn("mdl_jax.runtime.synchronous_cpu_dispatch: JAX's CPU backend has started already, "
                      "so its dispatch stays asynchronous; call it before the first JAX computation",
                      RuntimeWarning, stacklevel=2)
        return _Applied(False)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    return _Applied(True)
