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

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from pydantic import ConfigDict, PrivateAttr

from mdl_jax.gate.core import DEFAULT_MODEL, GateDecision
from mdl_jax.integrations import LiveGateFields, document_texts, gated_metadata
from mdl_jax.signals.embeddings import Embedder


class MDLDocumentCompressor(LiveGateFields, BaseDocumentCompressor):
    """Keeps the retrieved documents when MDL injects them (Active / Supp), drops them otherwise.

    Its fields are the gate's settings (``LiveGateFields``: ``embedder``, ``risk``, ``conflict``,
    ``config``, ``cache_dir``, ``embed_backend``, a fixed ``category`` and ``on_decision``);
    ``last_decision`` holds the latest decision.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    _gate: Any = PrivateAttr(default=None)
    _last: GateDecision | None = PrivateAttr(default=None)

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
          ValueError: ``documents`` that is not a list of ``Document`` with non-empty texts (naming
            the index), an empty query (``MemoryGate.decide``).
        """
        documents, texts = document_texts("documents", documents, Document, lambda doc: doc.page_content)
        d = self._decide(query, texts)
        if not d.injects:
            return []
        return [Document(page_content=doc.page_content, metadata=gated_metadata(doc.metadata, d),
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
