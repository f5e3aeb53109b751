"""The memory gate: MDL for any (query, memories) — Python (``MemoryGate``) and ``mdl-jax gate``.

Imports the controller and the signal wing, never the pipeline; torch loads only when a text is first
embedded. The framework components (``mdl_jax.integrations``) build on it.
"""

from mdl_jax.gate.core import ACTION_NAMES, SCALARS, GateDecision, MemoryGate

__all__ = ["ACTION_NAMES", "GateDecision", "MemoryGate", "SCALARS"]
