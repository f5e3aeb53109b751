"""LlamaIndex: MDL as a node postprocessor (``pip install 'mdl-jax[llamaindex]'``).

    gate = MDLNodePostprocessor(risk=0.5)
    nodes = gate.postprocess_nodes(index.as_retriever().retrieve(q), query_str=q)
    # or: index.as_query_engine(node_postprocessors=[gate])
    gate.last_decision.action_name

Active and Supp keep every node (copies whose metadata gains ``mdl_action``, ``mdl_scalars`` and, for
Supp, ``mdl_caution``; those keys are excluded from the text LlamaIndex shows the LLM and the
embedder, so the scores do not leak into prompts); Silent and Opt-Out return no nodes: read
``last_decision`` or pass ``on_decision``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import PrivateAttr

from mdl_jax.gate.core import DEFAULT_MODEL, GateDecision
from mdl_jax.integrations import METADATA_KEYS, LiveGateFields, build_gate, decision_metadata
from mdl_jax.signals.embeddings import Embedder


class MDLNodePostprocessor(LiveGateFields, BaseNodePostprocessor):
    """Keeps the retrieved nodes when MDL injects them (Active / Supp), drops them otherwise.

    Fields: ``MemoryGate``'s arguments (``embedder``, ``risk``, ``conflict``, ``config``,
    ``cache_dir``), a fixed ``category``, and ``on_decision`` (called with each ``GateDecision``).
    ``last_decision`` holds the latest decision. Use it through LlamaIndex's
    ``postprocess_nodes(nodes, query_str=...)`` or as a query engine's ``node_postprocessors``: kept
    nodes are copies whose metadata gains ``mdl_action``, ``mdl_scalars`` (and ``mdl_caution`` for
    Supp), keys excluded from the text shown to the LLM and the embedder; Silent and Opt-Out keep
    none. A call without a query is a ``ValueError`` naming ``query_bundle``; a bad setting fails at
    construction (the gate is built then), as pydantic's ``ValidationError`` (a ``ValueError``).

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
      on_decision: called with each ``GateDecision``, or None.
    """

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
        self._gate = build_gate(self.embedder, self.risk, self.conflict, self.config, self.cache_dir,
                                 self.embed_backend)

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name of the component (for serialisation)."""
        return "MDLNodePostprocessor"


    @property
    def last_decision(self) -> GateDecision | None:
        """The decision of the latest call (None before the first)."""
        return self._last

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("query_bundle: MDL needs the query (pass query_str or query_bundle)")
        texts = [n.node.get_content() for n in nodes]
        d = self._gate.decide(query_bundle.query_str, texts, category=self.category)
        self._last = d
        if self.on_decision is not None:
            self.on_decision(d)
        if not d.injects:
            return []
        meta = decision_metadata(d)
        out = []
        for n in nodes:
            node = n.node.model_copy()
            node.metadata = {**n.node.metadata, **meta}
            hide = [k for k in METADATA_KEYS if k in meta]
            node.excluded_llm_metadata_keys = list(n.node.excluded_llm_metadata_keys) + hide
            node.excluded_embed_metadata_keys = list(n.node.excluded_embed_metadata_keys) + hide
            out.append(NodeWithScore(node=node, score=n.score))
        return out


class MiniLMEmbedding(BaseEmbedding):
    """A LlamaIndex embedding model over mdl-jax's embedder (the bundled MiniLM, cached on disk)."""

    model: str = DEFAULT_MODEL
    cache_dir: str | None = None
    backend: str = "auto"  # as the gate's: the two then share one cache key, so a text is embedded once
    _emb: Any = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        self._emb = Embedder(self.model, cache_dir=self.cache_dir, backend=self.backend)

    @classmethod
    def class_name(cls) -> str:
        return "MiniLMEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._emb.embed([query])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._emb.embed([text])[0].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._emb.embed(texts).tolist() if texts else []
