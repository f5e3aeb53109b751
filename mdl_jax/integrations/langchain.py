"""LangChain: MDL as a document compressor (``pip install 'mdl-jax[langchain]'``).

    from langchain_classic.retrievers import ContextualCompressionRetriever  # or langchain.retrievers
    gate = MDLDocumentCompressor(risk="truthfulqa", category="Health")
    retriever = ContextualCompressionRetriever(base_compressor=gate, base_retriever=store.as_retriever())
    docs = retriever.invoke("Is it safe to eat raw cookie dough?")
    gate.last_decision.action_name   # "Active" | "Supp" | "Silent" | "Opt-Out"

Active and Supp keep every retrieved document (copies, their metadata extended with ``mdl_action``,
``mdl_scalars`` and, for Supp, ``mdl_caution``: the instruction to put beside them in the prompt);
Silent and Opt-Out return no documents: read ``last_decision`` (or pass ``on_decision``) to tell them
apart and, for Opt-Out, answer ``last_decision.abstention`` without calling the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from pydantic import ConfigDict, PrivateAttr

from mdl_jax.gate.core import DEFAULT_MODEL, GateDecision
from mdl_jax.integrations import LiveGateFields, build_gate, decision_metadata
from mdl_jax.signals.embeddings import Embedder


class MDLDocumentCompressor(LiveGateFields, BaseDocumentCompressor):
    """Keeps the retrieved documents when MDL injects them (Active / Supp), drops them otherwise.

    Fields are ``MemoryGate``'s arguments (``embedder``, ``risk``, ``conflict``, ``config``,
    ``cache_dir``), a fixed ``category`` for a category-table risk, and ``on_decision``, called with
    each ``GateDecision``. ``last_decision`` holds the latest one (one per compressor: give each
    concurrent chain its own compressor, or use ``on_decision``).

    The gate is built (and its settings checked) at construction: a bad risk or config fails there,
    not at the first query, as pydantic's ``ValidationError`` (a ``ValueError``) carrying the gate's
    message, which names the setting.

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
        CPU with it, else ONNX Runtime, where installed; else torch), "torch", "onnx", "onnx-int8" or "openvino-bf16".
      category: a fixed category for a category-table or preset risk, used for every query.
      on_decision: called with each ``GateDecision`` (also the Silent / Opt-Out ones, which keep
        no documents), or None.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    embedder: Any = DEFAULT_MODEL
    risk: Any = 0.5
    conflict: Callable | None = None
    config: Any = None
    cache_dir: str | None = None
    embed_backend: str = "auto"
    category: str | None = None
    on_decision: Callable[[GateDecision], Any] | None = None

    _gate: Any = PrivateAttr(default=None)
    _last: GateDecision | None = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        """Pydantic's post-construction hook: builds the gate from the fields (checking them)."""
        # Built (and checked) at construction: a bad risk or config fails here, not at the first query.
        self._gate = build_gate(self.embedder, self.risk, self.conflict, self.config, self.cache_dir,
                                 self.embed_backend)


    @property
    def last_decision(self) -> GateDecision | None:
        """The decision of the latest ``compress_documents`` call (None before the first)."""
        return self._last

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        """Documents to keep for ``query``: all (with the decision in their metadata) or none.

        Args:
          documents: the retrieved documents.
          query: the query they were retrieved for.
          callbacks: LangChain callbacks (unused: the gate makes no model call).

        Returns:
          For Active / Supp, copies of every document whose ``metadata`` gains ``mdl_action``,
            ``mdl_scalars`` and, for Supp, ``mdl_caution``; for Silent / Opt-Out, [].

        Raises:
          ValueError: an empty query or an empty document text (``MemoryGate.decide``).
        """
        d = self._gate.decide(query, [doc.page_content for doc in documents], category=self.category)
        self._last = d
        if self.on_decision is not None:
            self.on_decision(d)
        if not d.injects:
            return []
        meta = decision_metadata(d)
        return [Document(page_content=doc.page_content, metadata={**doc.metadata, **meta},
                         id=doc.id) for doc in documents]


class MiniLMEmbeddings(Embeddings):
    """LangChain ``Embeddings`` over mdl-jax's embedder (the bundled MiniLM, cached on disk), so a
    vector store and the gate share one model and one cache."""

    def __init__(self, model: str = DEFAULT_MODEL, cache_dir: str | None = None, backend: str = "auto"):
        # "auto", as the gate's: the two then share one cache key, so a text is embedded once
        self.embedder = Embedder(model, cache_dir=cache_dir, backend=backend)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embedder.embed(texts).tolist() if texts else []

    def embed_query(self, text: str) -> list[float]:
        return self.embedder.embed([text])[0].tolist()
