"""Faster implementations of the controller, each loaded only when a caller names it.

  native.py   the CPU kernel (``_native/decide_cpu.cc``) for ``decide`` and ``sweep``: built with the
              system C++ compiler on first use, cached, registered with XLA's FFI; and the build
              machinery the signals' C++ helpers share
  fused.py    the fused Pallas (Triton) GPU kernel for ``decide`` and ``sweep``

``decide``, ``sweep`` and ``calibrate`` take ``engine=``: "jax" (the default, the pure-JAX definition in
``mdl_jax.controller``), "native", "pallas" (this package's fused kernel) or "auto" (the fastest that can
run the call here). The controller imports an engine's module by name (``controller.api.engine_module``)
on the first call that asks for it, never at import time; an engine imports the controller, never the
reverse.

What an engine module provides (the contract the controller calls):
  why_not(cfg, signals) → None, or why ``decide`` cannot run this call on it here (a short reason)
  decide_engine(M, R, A, cfg, *, strict) → the ``Decision`` of checked float32 signals
  sweep_why_not(cfg, K) → None, or why ``sweep`` cannot run this batch on it here
  sweep_engine(cfg, K, size, ...) → ``sweep``'s pass function
"""
