"""MDL's framework components against the filters they replace, per query, same embedder, same data:

  LangChain   ``MDLDocumentCompressor``  vs ``EmbeddingsFilter`` (similarity_threshold 0.5), both on
              mdl-jax's MiniLM embeddings (``MiniLMEmbeddings``: the bundled model, the same disk cache)
  LlamaIndex  ``MDLNodePostprocessor``   vs ``SimilarityPostprocessor`` (similarity_cutoff 0.5) over the
              nodes a retriever scored with the same MiniLM; the peer is timed alone (what it costs a
              pipeline whose retriever already scored the nodes) and with that scoring

    pip install -e ".[peers]"                         # the two frameworks and langchain-community
    python -m experiments.bench_gate_peers            # 120 TruthfulQA queries x 6 documents, 3 passes
    python -m experiments.bench_gate_peers --quick    # 40 queries, 2 passes

Cold: every text new to the embedding cache (a fresh cache folder per component; the model is loaded
before timing). Warm: the same queries again, every text cached. Components alternate per query (peer,
MDL, then MDL, peer on the next) so load changes hit both; figures are medians of per-query times (ms),
and the ratio MDL / peer of those medians. Targets: warm ≤ 1.2x the filter's, cold ≤ 1x.
The CPU and its ISA flags are printed first. Last line: JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments.bench_embed import cpu_flags

ROOT = Path(__file__).resolve().parents[1]


def _data(n: int):
    from mdl_repro.pipeline.data import load
    from mdl_repro.pipeline.stores import StoreConfig, build_stores

    stores = build_stores(load("truthfulqa", ROOT.parent / "shared" / "data", limit=n), StoreConfig(seed=0))
    return [(s.item.question, s.texts[:6]) for s in stores]


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _cosine(x, y) -> np.ndarray:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (y / np.linalg.norm(y, axis=1, keepdims=True)).T


def langchain_pair(rows, work: Path, passes: int) -> dict:
    import importlib.util

    from langchain_classic.retrievers.document_compressors import EmbeddingsFilter
    if importlib.util.find_spec("langchain_community") is None:  # EmbeddingsFilter imports it per call
        raise SystemExit('bench_gate_peers: LangChain\'s EmbeddingsFilter needs langchain-community: '
                         'pip install -e ".[peers]"')
    from langchain_core.documents import Document

    from mdl_jax.integrations.langchain import MDLDocumentCompressor, MiniLMEmbeddings

    res = {}
    for phase in ("cold", "warm"):
        peer_t: list[float] = []
        mdl_t: list[float] = []
        for p in range(passes if phase == "warm" else 1):
            if phase == "cold":
                tag = f"lc-{p}"
                # similarity_fn given: its default lives in langchain-community, not a dependency here;
                # the same NumPy cosine matrix it computes
                peer = EmbeddingsFilter(embeddings=MiniLMEmbeddings(cache_dir=str(work / f"{tag}-peer")),
                                        similarity_fn=_cosine, similarity_threshold=0.5)
                mdl = MDLDocumentCompressor(cache_dir=str(work / f"{tag}-mdl"))
                peer.embeddings.embed_query("warm the model up")
                mdl.gate.decide("warm the model up", ["one memory", "another memory"])  # compile too
                comps = (peer, mdl)
            for i, (q, texts) in enumerate(rows):
                docs = [Document(page_content=t) for t in texts]
                order = ((0, peer_t), (1, mdl_t)) if i % 2 == 0 else ((1, mdl_t), (0, peer_t))
                for k, sink in order:
                    sink.append(_time(functools.partial(comps[k].compress_documents, docs, q)))
        res[phase] = {"peer_ms": statistics.median(peer_t), "mdl_ms": statistics.median(mdl_t)}
        res[phase]["ratio"] = res[phase]["mdl_ms"] / res[phase]["peer_ms"]
    return res


def _retrieve_and_filter(emb, peer, q, texts, alone: list):
    """What a LlamaIndex retriever does for the peer (query and node vectors, cosine scores), then the
    peer; ``alone`` gets the peer's own share."""
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    qv = np.asarray(emb.get_query_embedding(q))
    tv = np.asarray(emb.get_text_embedding_batch(texts))
    nodes = [NodeWithScore(node=TextNode(text=t), score=float(s)) for t, s in zip(texts, tv @ qv)]
    t0 = time.perf_counter()
    peer.postprocess_nodes(nodes, query_bundle=QueryBundle(q))
    alone.append((time.perf_counter() - t0) * 1e3)


def _mdl_nodes(mdl, q, texts):
    from llama_index.core.schema import NodeWithScore, TextNode

    mdl.postprocess_nodes([NodeWithScore(node=TextNode(text=t), score=0.0) for t in texts], query_str=q)


def llamaindex_pair(rows, work: Path, passes: int) -> dict:
    from llama_index.core.postprocessor import SimilarityPostprocessor

    from mdl_jax.integrations.llamaindex import MDLNodePostprocessor, MiniLMEmbedding

    res = {}
    for phase in ("cold", "warm"):
        alone: list[float] = []
        scored: list[float] = []
        mdl_t: list[float] = []
        for p in range(passes if phase == "warm" else 1):
            if phase == "cold":
                emb = MiniLMEmbedding(cache_dir=str(work / f"li-{p}-peer"))
                peer = SimilarityPostprocessor(similarity_cutoff=0.5)
                mdl = MDLNodePostprocessor(cache_dir=str(work / f"li-{p}-mdl"))
                emb.get_query_embedding("warm the model up")
                mdl.gate.decide("warm the model up", ["one memory", "another memory"])
            for i, (q, texts) in enumerate(rows):
                order = ((functools.partial(_retrieve_and_filter, emb, peer, q, texts, alone), scored),
                         (functools.partial(_mdl_nodes, mdl, q, texts), mdl_t))
                for fn, sink in (order if i % 2 == 0 else order[::-1]):
                    sink.append(_time(fn))
        res[phase] = {"peer_alone_ms": statistics.median(alone), "peer_with_scoring_ms": statistics.median(scored),
                      "mdl_ms": statistics.median(mdl_t)}
        res[phase]["ratio_alone"] = res[phase]["mdl_ms"] / res[phase]["peer_alone_ms"]
        res[phase]["ratio_with_scoring"] = res[phase]["mdl_ms"] / res[phase]["peer_with_scoring_ms"]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 queries, 2 passes")
    args = ap.parse_args(argv)
    n, passes = (40, 2) if args.quick else (120, 3)
    cpu = cpu_flags()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}; "
          f"load average {os.getloadavg()[0]:.1f}; {n} TruthfulQA queries x 6 documents", flush=True)
    from mdl_jax.signals.embeddings import DEFAULT_MODEL, auto_backend, resolve_model

    # both sides of each pair embed with the same model on the same backend: the components' default
    # "auto" (the peers' embeddings are MiniLMEmbeddings / MiniLMEmbedding, whose default it is too)
    print(f"embedder: {DEFAULT_MODEL}, backend {auto_backend(resolve_model(DEFAULT_MODEL)[0])} ('auto') "
          "for MDL and the peers alike", flush=True)
    rows = _data(n)
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    try:
        lc = langchain_pair(rows, work, passes)
        li = llamaindex_pair(rows, work, passes)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the runs' embedding caches
    print(f"\n{'component':48s} {'cold ms':>9s} {'warm ms':>9s}")
    print(f"{'LangChain EmbeddingsFilter':48s} {lc['cold']['peer_ms']:9.2f} {lc['warm']['peer_ms']:9.2f}")
    print(f"{'LangChain MDLDocumentCompressor':48s} {lc['cold']['mdl_ms']:9.2f} {lc['warm']['mdl_ms']:9.2f}")
    print(f"{'LlamaIndex SimilarityPostprocessor (alone)':48s} {li['cold']['peer_alone_ms']:9.3f} "
          f"{li['warm']['peer_alone_ms']:9.3f}")
    print(f"{'LlamaIndex retriever scoring + SimilarityPostproc.':48s} {li['cold']['peer_with_scoring_ms']:9.2f} "
          f"{li['warm']['peer_with_scoring_ms']:9.2f}")
    print(f"{'LlamaIndex MDLNodePostprocessor':48s} {li['cold']['mdl_ms']:9.2f} {li['warm']['mdl_ms']:9.2f}")
    print("\nTargets:")

    def row(name, ratio, bound):
        print(f"  {name:60s} {ratio:5.2f}x  {'met' if ratio <= bound else 'NOT met'} (≤ {bound}x)")
    row("LangChain warm: MDL / EmbeddingsFilter", lc["warm"]["ratio"], 1.2)
    row("LangChain cold: MDL / EmbeddingsFilter", lc["cold"]["ratio"], 1.0)
    row("LlamaIndex warm: MDL / (retriever scoring + SimilarityPostprocessor)", li["warm"]["ratio_with_scoring"], 1.2)
    row("LlamaIndex cold: MDL / (retriever scoring + SimilarityPostprocessor)", li["cold"]["ratio_with_scoring"], 1.0)
    print(f"  (LlamaIndex against the postprocessor alone, which only compares scores the retriever computed: "
          f"warm {li['warm']['ratio_alone']:.0f}x, cold {li['cold']['ratio_alone']:.0f}x; no target can be met "
          "there by a gate that reads the texts)")
    print(json.dumps({"bench": "gate-peers", "cpu": cpu, "load_average": os.getloadavg()[0], "n_queries": n,
                      "langchain": lc, "llamaindex": li}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
