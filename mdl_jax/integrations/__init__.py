"""MDL inside the frameworks people already run (the leaf wing: it imports the gate, nothing imports it).

  langchain.py    ``MDLDocumentCompressor`` (a ``BaseDocumentCompressor``: use it in
                  ``ContextualCompressionRetriever``) and ``MiniLMEmbeddings``
  llamaindex.py   ``MDLNodePostprocessor`` (a ``BaseNodePostprocessor``) and ``MiniLMEmbedding``
  haystack.py     ``MDLGate``, a Haystack component: documents in, documents + decision out

Each module imports its framework (an optional extra: ``pip install 'mdl-jax[langchain]'``,
``[llamaindex]``, ``[haystack]``) and nothing else outside mdl-jax; this package imports none of them.
Every component holds the gate's settings as fields and delegates the decision to ``MemoryGate``. Kept
documents carry the decision in their metadata (``mdl_action``, ``mdl_scalars``, and ``mdl_caution``
for Supp); Silent and Opt-Out keep none, and the decision is readable as ``last_decision`` and through
an ``on_decision`` callback (Haystack: the ``decision`` output).
"""

from __future__ import annotations

from mdl_jax.gate.core import Action, GateDecision, MemoryGate
from mdl_jax.prompts import CAUTION


def decision_metadata(d: GateDecision) -> dict:
    """What a kept document carries: {"mdl_action", "mdl_scalars"} (+ "mdl_caution" for Supp)."""
    meta = {"mdl_action": d.action_name, "mdl_scalars": dict(d.scalars)}
    if d.action == Action.SUPP:
        meta["mdl_caution"] = CAUTION
    return meta


def build_gate(embedder, risk, conflict, config, cache_dir, embed_backend="auto") -> MemoryGate:
    """The gate behind a component's fields (built at construction, and again when one is set)."""
    return MemoryGate(embedder=embedder, risk=risk, conflict=conflict, config=config, cache_dir=cache_dir,
                      embed_backend=embed_backend)


# The component fields the gate is built from: setting one builds the gate anew (``rebuilt_gate``), so a
# field never says one thing while the gate decides with another.
GATE_FIELDS = ("embedder", "risk", "conflict", "config", "cache_dir", "embed_backend")


def rebuilt_gate(component, name: str, value) -> MemoryGate:
    """The gate of ``component``'s fields with ``name`` set to ``value``; raises (changing nothing) where
    ``MemoryGate`` refuses the value."""
    fields = {f: getattr(component, f) for f in GATE_FIELDS}
    fields[name] = value
    return build_gate(**fields)


class LiveGateFields:
    """For a pydantic component whose fields are the gate's settings and whose private ``_gate`` is the
    gate built from them: setting a field of ``GATE_FIELDS`` builds the gate anew, checked before the
    field changes (a refused value changes nothing)."""

    def __setattr__(self, name: str, value) -> None:
        if name in GATE_FIELDS and getattr(self, "_gate", None) is not None:
            gate = rebuilt_gate(self, name, value)
            super().__setattr__(name, value)
            self._gate = gate
            return
        super().__setattr__(name, value)

    def model_copy(self, *, update=None, deep: bool = False):
        """Pydantic's copy; one whose ``update`` sets a gate setting gets its own gate, built from its
        fields (pydantic's copy takes neither ``__setattr__`` nor validation: it would share this gate)."""
        copy = super().model_copy(update=update, deep=deep)  # type: ignore[misc]
        if update and set(update) & set(GATE_FIELDS):
            copy._gate = build_gate(**{f: getattr(copy, f) for f in GATE_FIELDS})
        return copy

    @property
    def gate(self) -> MemoryGate:
        """The ``MemoryGate`` behind the fields."""
        return self._gate


METADATA_KEYS = ("mdl_action", "mdl_scalars", "mdl_caution")
