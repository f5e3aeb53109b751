"""Faster implementations of the controller, each loaded only when a caller names it.

  native.py        the native CPU engine's front: ``decide`` on the C++ kernel (``_native/decide_cpu.cc``)
                   and the names callers use, re-exported from the modules below
  native_sweep.py  the native engine of ``sweep``: configs × records in one kernel call per pass
  kernel.py        the kernel's library in this process: built on first use, loaded, registered with
                   XLA's FFI
  packing.py       a config as the kernel's float32 params buffer (also read by the fused kernel)
  cpu.py           what this CPU and process can run: flags, the ISA variant, usable CPUs
  toolchain.py     build machinery (compile, verify, cache, load a C++ library), shared with the
                   signals' C++ helpers
  fused.py         the fused Pallas (Triton) GPU kernel for ``decide`` and ``sweep``

``decide``, ``sweep`` and ``calibrate`` take ``engine=``: "jax" (the default, the pure-JAX definition in
``mdl_jax.controller``), "native", "pallas" (this package's fused kernel) or "auto" (the fastest that can
run the call here). The controller imports an engine's module by name (``controller.api.engine_module``)
on the first call that asks for it, never at import time; an engine imports the controller, never the
reverse.

What an engine module provides (the contract the controller calls):
  why_not(cfg, signals, *, warn) → None, or why ``decide`` cannot run this call on it here (a short
                 reason); ``warn=False`` when the caller named the engine: it raises the reason, so a
                 warning that the pure-JAX engine runs instead would be false
  decide_engine(M, R, A, cfg, *, strict) → the ``Decision`` of checked float32 signals
  sweep_why_not(cfg, K, *, warn) → None, or why ``sweep`` cannot run this batch on it here
  sweep_engine(cfg, K, size, ...) → ``sweep``'s pass function
"""
