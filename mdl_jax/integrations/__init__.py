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

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from mdl_jax.gate.checks import memory_texts
from mdl_jax.gate.core import DEFAULT_MODEL, Action, GateDecision, MemoryGate
from mdl_jax.prompts import CAUTION

METADATA_KEYS = ("mdl_action", "mdl_scalars", "mdl_caution")


def decision_metadata(d: GateDecision) -> dict:
    """What a kept document carries: {"mdl_action", "mdl_scalars"} (+ "mdl_caution" for Supp)."""
    meta = {"mdl_action": d.action_name, "mdl_scalars": dict(d.scalars)}
    if d.action == Action.SUPP:
        meta["mdl_caution"] = CAUTION
    return meta


def gated_metadata(metadata: Mapping, d: GateDecision) -> dict:
    """A kept document's metadata: ``metadata`` without the keys of an earlier decision, plus this
    one's. A document gated twice (a stored Supp output retrieved again) kept the first decision's
    ``mdl_caution`` beside the second's ``mdl_action``: an Active document read as one to caution."""
    return {**{k: v for k, v in metadata.items() if k not in METADATA_KEYS}, **decision_metadata(d)}


def document_texts(name: str, documents: Any, kind: type, text: Callable[[Any], Any]) -> tuple[list, list[str]]:
    """(``documents`` as a list, the text of each) for a component's input, ``name`` its argument.

    The documents are read into a list once: a generator handed in was consumed by reading the texts,
    and the decision's kept documents then came out empty while the decision said Active. Each must be
    a ``kind`` whose ``text`` is a non-empty string; anything else is a ValueError naming ``name`` and
    the index (not an AttributeError from inside the component, or the gate's ``memories[i]``).
    """
    if isinstance(documents, (str, bytes, Mapping)) or not isinstance(documents, Iterable):
        raise ValueError(f"{name}: expected a list of {kind.__name__}, got {type(documents).__name__}")
    docs = list(documents)
    for i, doc in enumerate(docs):
        if not isinstance(doc, kind):
            raise ValueError(f"{name}[{i}]: expected a {kind.__name__}, got {type(doc).__name__}")
    return docs, memory_texts(name, [text(doc) for doc in docs])


def build_gate(embedder, risk, conflict, config, cache_dir, embed_backend="auto") -> MemoryGate:
    """The gate behind a component's fields (built at construction, and again when one is set)."""
    return MemoryGate(embedder=embedder, risk=risk, conflict=conflict, config=config, cache_dir=cache_dir,
                      embed_backend=embed_backend)


# The component fields the gate is built from: setting one builds the gate anew (``rebuilt_gate``), so a
# field never says one thing while the gate decides with another.
GATE_FIELDS = ("embedder", "risk", "conflict", "config", "cache_dir", "embed_backend")
# every field of ``LiveGateFields``: what a pickled component must carry to decide as the original
LIVE_FIELDS = (*GATE_FIELDS, "category", "on_decision")


def rebuilt_gate(component, name: str, value) -> MemoryGate:
    """The gate of ``component``'s fields with ``name`` set to ``value``; raises (changing nothing) where
    ``MemoryGate`` refuses the value."""
    fields = {f: getattr(component, f) for f in GATE_FIELDS}
    fields[name] = value
    return build_gate(**fields)


class LiveGateFields:
    """The fields of a pydantic component (LangChain's, LlamaIndex's) that are the gate's settings, and
    the gate built from them (its private ``_gate``, built and checked at construction): setting a
    field of ``GATE_FIELDS`` builds the gate anew, checked before the field changes (a refused value
    changes nothing). A bad setting fails at construction, not at the first query, as pydantic's
    ``ValidationError`` (a ``ValueError``) carrying the gate's message, which names the setting.

    Attributes:
      embedder: as ``MemoryGate``'s: a sentence-transformers name or path (default the bundled
        MiniLM), an object with ``embed(texts)``, or a callable texts → (N, d).
      risk: as ``MemoryGate``'s: a number in [0, 1], a preset ("truthfulqa", "halueval"), a
        {category: risk} table or a callable (query, category) → A.
      conflict: as ``MemoryGate``'s: texts → S×S contradiction flags; None: the paper's lexical
        detector.
      config: an ``MDLConfig`` or a config file path; None: the paper's defaults.
      cache_dir: the named embedder's vector cache folder (None: its default).
      embed_backend: what runs a named embedder, as ``MemoryGate``'s: "auto" (OpenVINO bfloat16 on a
        CPU with it, else ONNX Runtime, where installed; else torch), "torch", "onnx", "onnx-int8" or
        "openvino-bf16".
      category: a fixed category for a category-table or preset risk, used for every query.
      on_decision: called with each ``GateDecision`` (also the Silent / Opt-Out ones, which keep
        nothing), or None.
    """

    if TYPE_CHECKING:  # set by the component's pydantic private attributes
        _gate: MemoryGate
        _last: GateDecision | None

    # pydantic collects the annotated fields of a plain base class too: declared once, here.
    embedder: Any = DEFAULT_MODEL
    risk: Any = 0.5
    conflict: Callable | None = None
    config: Any = None
    cache_dir: str | None = None
    embed_backend: str = "auto"
    category: str | None = None
    on_decision: Callable[[GateDecision], Any] | None = None

    def model_post_init(self, __context: Any) -> None:
        """Pydantic's post-construction hook: builds the gate from the fields (checking them)."""
        self._gate = build_gate(**{f: getattr(self, f) for f in GATE_FIELDS})

    def __setattr__(self, name: str, value) -> None:
        if name in GATE_FIELDS and getattr(self, "_gate", None) is not None:
            gate = rebuilt_gate(self, name, value)
            super().__setattr__(name, value)
            self._gate = gate
            return
        super().__setattr__(name, value)

    def __getstate__(self) -> dict[Any, Any]:
        """Pickle's state without the gate (rebuilt from the fields on unpickling: it holds the
        settings as closures, which do not pickle). A field the framework left out of the state as
        unpicklable (LlamaIndex drops it with a logged warning, and the unpickled component decided
        with that setting's default: a lambda risk became A = 0.5) is a TypeError naming it."""
        state: dict[Any, Any] = super().__getstate__()  # type: ignore[assignment]
        missing = [f for f in LIVE_FIELDS if f not in state.get("__dict__", {})]
        if missing:
            raise TypeError(f"{missing[0]}: cannot be pickled ({getattr(self, missing[0])!r}), and the "
                            "unpickled component would use the default instead; give a module-level "
                            "function or a picklable object"[:300])
        if state.get("__pydantic_private__") is not None:
            state["__pydantic_private__"] = {**state["__pydantic_private__"], "_gate": None}
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        if getattr(self, "_gate", None) is None:
            self._gate = build_gate(**{f: getattr(self, f) for f in GATE_FIELDS})

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

    @property
    def last_decision(self) -> GateDecision | None:
        """The decision of the latest call (None before the first): one per component, so give each
        concurrent chain its own component, or use ``on_decision``."""
        return self._last

    def _decide(self, query: str, texts: list[str]) -> GateDecision:
        """The gate's decision for ``query`` and the retrieved ``texts`` under the fixed ``category``,
        kept as ``last_decision`` and handed to ``on_decision``."""
        d = self._gate.decide(query, texts, category=self.category)
        self._last = d
        if self.on_decision is not None:
            self.on_decision(d)
        return d

