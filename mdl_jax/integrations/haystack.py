"""Haystack: MDL as a pipeline component (``pip install 'mdl-jax[haystack]'``).

    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=5))
    pipe.add_component("gate", MDLGate(risk=0.5))
    pipe.connect("retriever.documents", "gate.documents")
    out = pipe.run({"retriever": {"query": q}, "gate": {"query": q}})
    out["gate"]["decision"]["action"], out["gate"]["documents"]

``documents``: every document for Active / Supp (copies whose ``meta`` gains ``mdl_action``,
``mdl_scalars`` and, for Supp, ``mdl_caution``), none for Silent / Opt-Out. ``decision``: the
``GateDecision.to_dict()`` (action, scalars, memories) plus ``abstention`` (the answer for Opt-Out).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Mapping
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.utils import deserialize_callable, serialize_callable

from mdl_jax.controller.config import MDLConfig
from mdl_jax.controller.config_file import config_to_dict
from mdl_jax.gate.core import DEFAULT_MODEL, GateDecision
from mdl_jax.integrations import GATE_FIELDS, build_gate, document_texts, gated_metadata, rebuilt_gate


@component
class MDLGate:
    """Documents in, the documents MDL injects and its decision out.

    Init parameters are ``MemoryGate``'s (``embedder``, ``risk``, ``conflict``, ``config``,
    ``cache_dir``) and a fixed ``category``; ``run`` may override ``category`` and ``risk`` per query.
    ``last_decision`` holds the latest ``GateDecision``.

    Args:
      embedder: the named embedder, an object with ``embed(texts)`` or a callable (as
        ``LiveGateFields``' field of the same name, which says more of each setting).
      risk: A: a number in [0, 1], a preset, a {category: risk} table or a callable.
      conflict: texts → S×S contradiction flags; None: the paper's lexical detector.
      config: an ``MDLConfig`` or a config file path; None: the paper's defaults.
      cache_dir: the named embedder's vector cache folder (None: its default).
      embed_backend: what runs a named embedder ("auto", "torch", "onnx", "onnx-int8", "openvino-bf16").
      category: a fixed category for a category-table or preset risk, used for every query.

    Raises:
      ValueError: a setting the gate refuses (``MemoryGate``), at construction.
    """

    def __init__(self, embedder: Any = DEFAULT_MODEL, risk: Any = 0.5, conflict: Any = None,
                 config: Any = None, cache_dir: str | None = None, category: str | None = None,
                 embed_backend: str = "auto"):
        self.embedder, self.risk, self.conflict = embedder, risk, conflict
        self.config, self.cache_dir, self.category = config, cache_dir, category
        self.embed_backend = embed_backend
        self.gate = build_gate(embedder, risk, conflict, config, cache_dir, embed_backend)
        self.last_decision: GateDecision | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # A gate setting takes effect: the gate is built anew (and checked) before the field changes.
        # (object's: @component makes a new class of this one, where super() without arguments fails.)
        if name in GATE_FIELDS and getattr(self, "gate", None) is not None:
            gate = rebuilt_gate(self, name, value)
            object.__setattr__(self, name, value)
            object.__setattr__(self, "gate", gate)
            return
        object.__setattr__(self, name, value)

    @component.output_types(documents=list[Document], decision=dict)
    def run(self, query: str, documents: list[Document], category: str | None = None,
            risk: float | None = None) -> dict:
        """{"documents": kept documents, "decision": {"action", "scalars", "memories", "abstention"}}.

        Args:
          query: the query the documents were retrieved for.
          documents: the retrieved documents.
          category: this query's category (None: the component's ``category``).
          risk: A for this query, a number in [0, 1] (None: the gate's assessor).

        Returns:
          {"documents": for Active / Supp, copies of every document whose ``meta`` gains
            ``mdl_action``, ``mdl_scalars`` and, for Supp, ``mdl_caution``; for Silent / Opt-Out, [];
            "decision": ``GateDecision.to_dict()`` with "memories" (the kept documents' contents)
            and "abstention" (the answer for Opt-Out)}.

        Raises:
          ValueError: ``documents`` that is not a list of ``Document`` with non-empty text content
            (naming the index), an empty query, a risk outside [0, 1], a category outside the risk
            table (``MemoryGate.decide``).
        """
        documents, texts = document_texts("documents", documents, Document, lambda doc: doc.content)
        d = self.gate.decide(query, texts,
                             category=category if category is not None else self.category, risk=risk)
        self.last_decision = d
        kept = []
        if d.injects:
            kept = [dataclasses.replace(doc, meta=gated_metadata(doc.meta, d)) for doc in documents]
        decision = d.to_dict()
        decision["memories"] = [doc.content for doc in kept]
        decision["abstention"] = d.abstention
        return {"documents": kept, "decision": decision}

    def to_dict(self) -> dict:
        """Serialisable when the settings are (a model name or path, a number / preset / table); a
        ``conflict`` detector is written as its import path (a module-level function).

        Raises:
          ValueError: a ``conflict`` detector that has no import path (a lambda, a nested function,
            a method): without it the loaded component would decide with the lexical detector.
        """
        conflict = None
        if self.conflict is not None:
            try:
                conflict = serialize_callable(self.conflict)
            except Exception as e:   # Haystack's SerializationError; an object without a __name__
                raise ValueError(f"conflict: expected a module-level function to serialise (written as "
                                 f"its import path), got {self.conflict!r} ({e})"[:300]) from None
        return default_to_dict(self, embedder=_plain(self.embedder), risk=_plain(self.risk),
                               conflict=conflict, config=_plain(self.config), cache_dir=_plain(self.cache_dir),
                               category=self.category, embed_backend=self.embed_backend)

    @classmethod
    def from_dict(cls, data: dict) -> MDLGate:
        """The component ``to_dict`` described (Haystack's pipeline loading); a ``conflict`` import
        path is imported under Haystack's allowlist of modules."""
        params = dict(data.get("init_parameters") or {})
        if isinstance(params.get("conflict"), str):
            params["conflict"] = deserialize_callable(params["conflict"])
        return default_from_dict(cls, {**data, "init_parameters": params})


def _plain(setting: Any) -> Any:
    """A setting as the plain values Haystack's pipeline writer (YAML) takes, meaning the same to the
    gate: an ``MDLConfig`` as the dict of its fields, a path as text, a risk table's keys as text
    (the gate reads categories as text) and NumPy numbers as floats; anything else as it is."""
    if isinstance(setting, MDLConfig):
        d = config_to_dict(setting)
        return {**d["numeric"], **d["static"]}
    if isinstance(setting, os.PathLike):
        return os.fspath(setting)
    if isinstance(setting, Mapping):
        return {str(k): _plain(v) for k, v in setting.items()}
    if isinstance(setting, numbers.Real) and type(setting) not in (bool, int, float):  # np.float64 too
        return float(setting)
    return setting
