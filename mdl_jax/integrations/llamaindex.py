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

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from pydantic import PrivateAttr

from mdl_jax.gate.core import DEFAULT_MODEL, GateDecision
from mdl_jax.integrations import METADATA_KEYS, LiveGateFields, document_texts, gated_metadata
from mdl_jax.signals.embeddings import Embedder


class MDLNodePostprocessor(LiveGateFields, BaseNodePostprocessor):
    """Keeps the retrieved nodes when MDL injects them (Active / Supp), drops them otherwise.

    Its fields are the gate's settings (``LiveGateFields``: ``embedder``, ``risk``, ``conflict``,
    ``config``, ``cache_dir``, ``embed_backend``, a fixed ``category`` and ``on_decision``);
    ``last_decision`` holds the latest decision. Use it through LlamaIndex's
    ``postprocess_nodes(nodes, query_str=...)`` or as a query engine's ``node_postprocessors``: kept
    nodes are copies whose metadata gains ``mdl_action``, ``mdl_scalars`` (and ``mdl_caution`` for
    Supp), keys excluded from the text shown to the LLM and the embedder; Silent and Opt-Out keep
    none. A call without a query is a ``ValueError`` naming ``query_bundle``; nodes that are not
    ``NodeWithScore`` with non-empty texts, one naming ``nodes`` and the index.
    """

    _gate: Any = PrivateAttr(default=None)
    _last: GateDecision | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex's name of the component (for serialisation)."""
        return "MDLNodePostprocessor"

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("query_bundle: MDL needs the query (pass query_str or query_bundle)")
        nodes, texts = document_texts("nodes", nodes, NodeWithScore, lambda n: n.node.get_content())
        d = self._decide(query_bundle.query_str, texts)
        if not d.injects:
            return []
        out = []
        for n in nodes:
            node = n.node.model_copy()
            node.metadata = gated_metadata(n.node.metadata, d)
            # each key once, however often the node was gated
            hide = [k for k in METADATA_KEYS if k in node.metadata]
            node.excluded_llm_metadata_keys = [k for k in n.node.excluded_llm_metadata_keys
                                               if k not in METADATA_KEYS] + hide
            node.excluded_embed_metadata_keys = [k for k in n.node.excluded_embed_metadata_keys
                                                 if k not in METADATA_KEYS] + hide
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
