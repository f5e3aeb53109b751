"""The LangChain, LlamaIndex and Haystack components against the real installed libraries: each keeps
the documents (with the decision in their metadata) exactly when MemoryGate injects them, drops them
for Silent / Opt-Out with the decision readable, works inside its framework's own retrieval machinery,
and the README examples run as written."""

import contextlib
import importlib.util
import io
import re
import runpy
from pathlib import Path

import pytest

from mdl_jax import Action, MDLConfig
from mdl_jax.gate import MemoryGate
from mdl_jax.prompts import CAUTION
from tests.test_gate import CASES, _lookup

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("haystack")

from haystack import Document as HDocument  # noqa: E402
from haystack import Pipeline  # noqa: E402
from langchain_core.documents import Document as LDocument  # noqa: E402
from llama_index.core.schema import NodeWithScore, TextNode  # noqa: E402

from mdl_jax.integrations.haystack import MDLGate  # noqa: E402
from mdl_jax.integrations.langchain import MDLDocumentCompressor, MiniLMEmbeddings  # noqa: E402
from mdl_jax.integrations.llamaindex import MDLNodePostprocessor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _langchain(mems, A, seen):
    comp = MDLDocumentCompressor(embedder=_lookup, risk=A, on_decision=seen.append)
    docs = [LDocument(page_content=m, metadata={"src": i}) for i, m in enumerate(mems)]
    kept = comp.compress_documents(docs, "q")
    assert [d.metadata["src"] for d in docs] == list(range(len(mems)))  # inputs untouched
    assert all("mdl_action" not in d.metadata for d in docs)
    return comp.last_decision, [(d.page_content, d.metadata) for d in kept]


def _llamaindex(mems, A, seen):
    post = MDLNodePostprocessor(embedder=_lookup, risk=A, on_decision=seen.append)
    nodes = [NodeWithScore(node=TextNode(text=m, metadata={"src": i}), score=1.0) for i, m in enumerate(mems)]
    kept = post.postprocess_nodes(nodes, query_str="q")
    assert all("mdl_action" not in n.node.metadata for n in nodes)
    for n in kept:  # the scores stay out of what LlamaIndex shows the LLM and the embedder
        assert "mdl_scalars" in n.node.metadata and "mdl_scalars" not in n.node.get_content("llm")
        assert "mdl_scalars" not in n.node.get_content("embed")
    return post.last_decision, [(n.node.get_content(), n.node.metadata) for n in kept]


def _haystack(mems, A, seen):
    gate = MDLGate(embedder=_lookup, risk=A)
    out = gate.run(query="q", documents=[HDocument(content=m, meta={"src": i}) for i, m in enumerate(mems)])
    seen.append(gate.last_decision)
    assert out["decision"]["action"] == gate.last_decision.action_name
    assert out["decision"]["scalars"] == gate.last_decision.scalars
    assert out["decision"]["abstention"] == gate.last_decision.abstention
    assert out["decision"]["memories"] == [d.content for d in out["documents"]]
    return gate.last_decision, [(d.content, d.meta) for d in out["documents"]]


@pytest.mark.parametrize("framework", [_langchain, _llamaindex, _haystack], ids=["langchain", "llamaindex", "haystack"])
@pytest.mark.parametrize("action", list(CASES))
def test_components_keep_documents_exactly_when_the_gate_injects(framework, action):
    mems, A = CASES[action]
    seen = []
    d, kept = framework(mems, A, seen)
    want = MemoryGate(embedder=_lookup).decide("q", mems, risk=A)
    assert d.action == want.action == action and d.scalars == want.scalars
    assert seen == [d] or (seen and seen[-1] is d)  # the decision is readable for every action
    if action in (Action.ACTIVE, Action.SUPP):
        assert [t for t, _ in kept] == mems
        for i, (_, meta) in enumerate(kept):
            assert meta["src"] == i and meta["mdl_action"] == d.action_name
            assert meta["mdl_scalars"] == d.scalars
            assert meta.get("mdl_caution") == (CAUTION if action == Action.SUPP else None)
    else:
        assert kept == []


def test_components_check_their_settings_at_construction():
    # (pydantic frames the gate's ValueError in a ValidationError, itself a ValueError)
    for make in (MDLDocumentCompressor, MDLNodePostprocessor, MDLGate):
        with pytest.raises(ValueError, match=r"risk: expected a number in \[0, 1\], got 2.0"):
            make(embedder=_lookup, risk=2.0)
        with pytest.raises(ValueError, match=r"config: .*config\.json: cannot read"):
            make(embedder=_lookup, config="/nonexistent/config.json")


@pytest.mark.parametrize("cls", [MDLDocumentCompressor, MDLNodePostprocessor, MDLGate])
def test_a_setting_changed_after_construction_takes_effect_or_is_refused(cls):
    """The gate was built once: a risk set later read 0.99 on the field while the gate decided with 0.2
    (and injected where a component built with 0.99 abstains); a bad value was taken silently."""
    mems, _ = CASES[Action.ACTIVE]
    c = cls(embedder=_lookup, risk=0.2)
    c.risk = 0.99
    assert c.risk == 0.99 and c.gate.decide("q", mems).scalars["A"] == pytest.approx(0.99)
    assert c.gate.decide("q", mems).action == cls(embedder=_lookup, risk=0.99).gate.decide("q", mems).action
    with pytest.raises(ValueError, match=r"^risk: expected a number in \[0, 1\], got 7"):
        c.risk = 7
    assert c.risk == 0.99 and c.gate.decide("q", mems).scalars["A"] == pytest.approx(0.99)   # nothing changed
    if cls is not MDLGate:   # pydantic's copy with an update gets its own gate
        copied = c.model_copy(update={"risk": 0.3})
        assert copied.gate.decide("q", mems).scalars["A"] == pytest.approx(0.3) and c.risk == 0.99
        with pytest.raises(ValueError, match=r"^risk: expected a number in \[0, 1\]"):
            c.model_copy(update={"risk": 7})
    before = c.gate.decide("q", mems, risk=0.0).action
    c.config = strict = MDLConfig(thresholds=(1.0, 1.0, 1.0))
    after = c.gate.decide("q", mems, risk=0.0).action
    assert after == Action.OPT_OUT != before and after == cls(embedder=_lookup, config=strict).gate.decide(
        "q", mems, risk=0.0).action


@pytest.mark.slow
def test_langchain_compressor_in_langchain_cores_retrieval_machinery(embedder, cache_dir):
    """The real InMemoryVectorStore and retriever, composed with the compressor by runnables (what
    ContextualCompressionRetriever does; that class lives in `langchain_classic`, tested below)."""
    from langchain_core.runnables import RunnableLambda, RunnableParallel, RunnablePassthrough
    from langchain_core.vectorstores import InMemoryVectorStore

    texts = ["Fortune cookies originated in San Francisco", "Fortune cookies originated in Japan",
             "Veins appear blue because blue light does not penetrate deeply", "Apples are nutritious"]
    store = InMemoryVectorStore.from_documents([LDocument(page_content=t) for t in texts],
                                               MiniLMEmbeddings(cache_dir=str(cache_dir)))
    retriever = store.as_retriever(search_kwargs={"k": 2})
    comp = MDLDocumentCompressor(embedder=embedder)
    chain = RunnableParallel(docs=retriever, query=RunnablePassthrough()) | RunnableLambda(
        lambda x: comp.compress_documents(x["docs"], x["query"]))
    q = "Where did fortune cookies originate?"
    kept = chain.invoke(q)
    d = MemoryGate(embedder=embedder).decide(q, texts[:2])
    assert comp.last_decision.scalars == d.scalars and d.action == Action.ACTIVE
    assert sorted(k.page_content for k in kept) == sorted(texts[:2])
    assert all(k.metadata["mdl_action"] == "Active" for k in kept)


@pytest.mark.skipif(importlib.util.find_spec("langchain_classic") is None,
                    reason="ContextualCompressionRetriever is in langchain_classic (the langchain extra)")
def test_langchain_compressor_in_contextual_compression_retriever(cache_dir):
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.vectorstores import InMemoryVectorStore

    for action, n in ((Action.ACTIVE, 2), (Action.OPT_OUT, 0)):
        texts, A = CASES[action]
        store = InMemoryVectorStore.from_documents([LDocument(page_content=t) for t in texts],
                                                   MiniLMEmbeddings(cache_dir=str(cache_dir)))
        comp = MDLDocumentCompressor(embedder=_lookup, risk=A)
        r = ContextualCompressionRetriever(base_compressor=comp, base_retriever=store.as_retriever(
            search_kwargs={"k": 2}))
        kept = r.invoke("q")
        assert len(kept) == n and comp.last_decision.action == action


@pytest.mark.slow
def test_llamaindex_postprocessor_after_a_real_vector_index(embedder, cache_dir):
    from llama_index.core import VectorStoreIndex

    from mdl_jax.integrations.llamaindex import MiniLMEmbedding

    texts = ["Fortune cookies originated in San Francisco", "Fortune cookies originated in Japan",
             "Apples are nutritious"]
    index = VectorStoreIndex([TextNode(text=t) for t in texts],
                             embed_model=MiniLMEmbedding(cache_dir=str(cache_dir)))
    post = MDLNodePostprocessor(embedder=embedder)
    q = "Where did fortune cookies originate?"
    kept = post.postprocess_nodes(index.as_retriever(similarity_top_k=2).retrieve(q), query_str=q)
    assert sorted(n.node.get_content() for n in kept) == sorted(texts[:2])
    assert post.last_decision.scalars == MemoryGate(embedder=embedder).decide(q, texts[:2]).scalars
    with pytest.raises(ValueError, match=r"^query_bundle: MDL needs the query"):
        post.postprocess_nodes(kept)


def test_haystack_component_in_a_pipeline_and_serialised(tmp_path):
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    store = InMemoryDocumentStore()
    store.write_documents([HDocument(content=t) for t in CASES[Action.OPT_OUT][0]])
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=2))
    pipe.add_component("gate", MDLGate(embedder=_lookup, risk=0.2))
    pipe.connect("retriever.documents", "gate.documents")
    out = pipe.run({"retriever": {"query": "fact"}, "gate": {"query": "q", "risk": 0.85}})
    assert out["gate"]["decision"]["action"] == "Opt-Out" and out["gate"]["documents"] == []
    g = MDLGate(risk="truthfulqa", category="Health", embed_backend="torch")
    again = MDLGate.from_dict(g.to_dict())
    assert (again.risk, again.category, again.embedder) == ("truthfulqa", "Health", g.embedder)
    assert again.embed_backend == "torch" and again.gate.embedder.backend == "torch"


def _readme_examples():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"<!-- example: (examples/\w+\.py) -->\n```python\n(.*?)```", text, re.S)


def test_readme_examples_are_the_example_files_and_run_as_written(cache_dir, monkeypatch):
    examples = _readme_examples()
    assert sorted(p for p, _ in examples) == ["examples/haystack_gate.py", "examples/langchain_gate.py",
                                              "examples/llamaindex_gate.py"]
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(cache_dir))
    for path, code in examples:
        assert code == (ROOT / path).read_text(), f"README's copy of {path} differs from the file"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(ROOT / path), run_name="__main__")
        lines = [x for x in out.getvalue().splitlines() if x.startswith("'")]
        assert len(lines) == 4, (path, out.getvalue())
        # the four questions of the examples reach all four actions with the bundled MiniLM
        for line, name in zip(lines, ("Active", "Supp", "Silent", "Opt-Out")):
            assert f": {name}, C_final" in line, (path, line)


def test_each_frameworks_embeddings_share_the_gates_backend_and_cache_key(tmp_path):
    """A vector store embedding with the framework embeddings and the gate read one cache: same key."""
    from mdl_jax.integrations.llamaindex import MDLNodePostprocessor, MiniLMEmbedding

    lc = MiniLMEmbeddings(cache_dir=str(tmp_path)).embedder
    assert lc.model_id == MDLDocumentCompressor(cache_dir=str(tmp_path)).gate.embedder.model_id
    li = MiniLMEmbedding(cache_dir=str(tmp_path))._emb
    assert li.model_id == MDLNodePostprocessor(cache_dir=str(tmp_path)).gate.embedder.model_id
    assert MDLGate(cache_dir=str(tmp_path)).gate.embedder.model_id == lc.model_id
    pinned = MiniLMEmbeddings(cache_dir=str(tmp_path), backend="torch").embedder
    assert pinned.model_id == MDLDocumentCompressor(cache_dir=str(tmp_path), embed_backend="torch").gate.embedder.model_id


def test_a_component_with_a_config_comes_back_from_its_serialised_form_with_that_config():
    """LlamaIndex's to_dict / from_dict (and Haystack's) write an MDLConfig as a dict of its fields;
    the component built from it decides with that config, not a refusal of the dict."""
    from mdl_jax import MDLConfig
    from mdl_jax.integrations.haystack import MDLGate
    from mdl_jax.integrations.llamaindex import MDLNodePostprocessor

    cfg = MDLConfig(sigma=0.3, thresholds=(0.7, 0.5, 0.3))
    post = MDLNodePostprocessor(embedder=_lookup, config=cfg)
    again = MDLNodePostprocessor.from_dict(post.to_dict())
    assert again.gate.config == cfg
    gate = MDLGate(embedder="all-MiniLM-L6-v2", config=cfg)
    assert MDLGate.from_dict(gate.to_dict()).gate.config == cfg
    with pytest.raises(ValueError, match=r"config: expected the fields of an MDLConfig \(.*sigmaa"):
        MDLNodePostprocessor(embedder=_lookup, config={"sigmaa": 0.3})


def test_components_keep_every_document_when_handed_an_iterator():
    """A generator of documents was read once for the texts: the decision said Active and no document
    came out."""
    mems, A = CASES[Action.ACTIVE]
    comp = MDLDocumentCompressor(embedder=_lookup, risk=A)
    kept = comp.compress_documents((LDocument(page_content=m) for m in mems), "q")
    assert comp.last_decision.action == Action.ACTIVE and [d.page_content for d in kept] == mems
    post = MDLNodePostprocessor(embedder=_lookup, risk=A)
    nodes = post.postprocess_nodes((NodeWithScore(node=TextNode(text=m), score=0.5) for m in mems), query_str="q")
    assert post.last_decision.action == Action.ACTIVE and [n.node.get_content() for n in nodes] == mems
    out = MDLGate(embedder=_lookup, risk=A).run(query="q", documents=(HDocument(content=m) for m in mems))
    assert out["decision"]["action"] == "Active" and [d.content for d in out["documents"]] == mems
    assert out["decision"]["memories"] == mems


@pytest.mark.parametrize("framework", ["langchain", "llamaindex", "haystack"])
def test_components_name_the_documents_argument_for_what_is_not_a_document_with_text(framework):
    """Strings, dicts or None in place of the documents were an AttributeError or TypeError from inside
    the component; a Haystack document without content was the gate's "memories[0] ... got ''"."""
    if framework == "langchain":
        comp = MDLDocumentCompressor(embedder=_lookup)
        call, name, doc = (lambda docs: comp.compress_documents(docs, "q")), "documents", LDocument
    elif framework == "llamaindex":
        post = MDLNodePostprocessor(embedder=_lookup)
        call, name, doc = (lambda docs: post.postprocess_nodes(docs, query_str="q")), "nodes", NodeWithScore
    else:
        gate = MDLGate(embedder=_lookup)
        call, name, doc = (lambda docs: gate.run(query="q", documents=docs)), "documents", HDocument
    for bad, got in ((None, "NoneType"), ("fact", "str"), ({"text": "fact"}, "dict")):
        with pytest.raises(ValueError, match=rf"^{name}: expected a list of {doc.__name__}, got {got}$"):
            call(bad)
    with pytest.raises(ValueError, match=rf"^{name}\[1\]: expected a {doc.__name__}, got str$"):
        call([_document(framework, "fact 0.95 a"), "fact 0.95 b"])
    with pytest.raises(ValueError, match=rf"^{name}\[0\]: expected a non-empty memory text, got ''"):
        call([_document(framework, "")])
    if framework == "haystack":
        with pytest.raises(ValueError, match=r"^documents\[0\]: expected a non-empty memory text, got None"):
            call([HDocument(content=None)])


def _document(framework, text, meta=None):
    if framework == "langchain":
        return LDocument(page_content=text, metadata=dict(meta or {}))
    if framework == "llamaindex":
        return NodeWithScore(node=TextNode(text=text, metadata=dict(meta or {})), score=0.5)
    return HDocument(content=text, meta=dict(meta or {}))


def _gate_documents(framework, docs, A):
    """(the decision, the kept documents' (text, metadata)) of ``framework``'s component on ``docs``."""
    if framework == "langchain":
        comp = MDLDocumentCompressor(embedder=_lookup, risk=A)
        return comp, [(d.page_content, d.metadata) for d in comp.compress_documents(docs, "q")]
    if framework == "llamaindex":
        post = MDLNodePostprocessor(embedder=_lookup, risk=A)
        kept = post.postprocess_nodes(docs, query_str="q")
        for n in kept:  # each decision key is excluded once from what the LLM and the embedder see
            for keys in (n.node.excluded_llm_metadata_keys, n.node.excluded_embed_metadata_keys):
                assert sorted(k for k in keys if k.startswith("mdl_")) == sorted(
                    k for k in n.node.metadata if k.startswith("mdl_"))
        return post, [(n.node.get_content(), n.node.metadata) for n in kept]
    gate = MDLGate(embedder=_lookup, risk=A)
    return gate, [(d.content, d.meta) for d in gate.run(query="q", documents=docs)["documents"]]


@pytest.mark.parametrize("framework", ["langchain", "llamaindex", "haystack"])
def test_a_document_gated_twice_carries_only_the_latest_decision(framework):
    """A Supp output stored and retrieved again, then kept as Active, still carried the first
    decision's mdl_caution beside mdl_action "Active"."""
    (supp,), A_supp = CASES[Action.SUPP]
    comp, [(_, first)] = _gate_documents(framework, [_document(framework, supp, {"src": 7})], A_supp)
    assert first["mdl_action"] == "Supp" and first["mdl_caution"] == CAUTION
    active, A_active = CASES[Action.ACTIVE]
    docs = [_document(framework, active[0], first), _document(framework, active[1], {"src": 8})]
    comp, kept = _gate_documents(framework, docs, A_active)
    assert comp.last_decision.action == Action.ACTIVE
    for (_, meta), src in zip(kept, (7, 8)):
        assert meta["mdl_action"] == "Active" and "mdl_caution" not in meta and meta["src"] == src
        assert meta["mdl_scalars"] == comp.last_decision.scalars


def _every_pair_conflicts(texts):
    """A conflict detector (module-level, so a serialised pipeline names it) that flags every pair."""
    n = len(texts)
    return [[i != j for j in range(n)] for i in range(n)]


def test_haystack_component_comes_back_from_its_serialised_form_with_its_conflict_detector(monkeypatch):
    """to_dict left the conflict detector out: the loaded component decided with the lexical one."""
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", "tests.test_integrations")  # Haystack's allowlist
    mems, A = CASES[Action.ACTIVE]
    gate = MDLGate(embedder="all-MiniLM-L6-v2", risk=A, conflict=_every_pair_conflicts)
    data = gate.to_dict()
    assert data["init_parameters"]["conflict"] == "tests.test_integrations._every_pair_conflicts"
    again = MDLGate.from_dict(data)
    assert again.conflict is _every_pair_conflicts
    assert again.gate.conflict(mems).tolist() == gate.gate.conflict(mems).tolist() == [[False, True], [True, False]]
    pipe = Pipeline()
    pipe.add_component("gate", gate)
    loaded = Pipeline.loads(pipe.dumps(), allowed_modules=["mdl_jax.integrations.haystack"])
    assert loaded.get_component("gate").conflict is _every_pair_conflicts
    assert MDLGate.from_dict(MDLGate(embedder="all-MiniLM-L6-v2").to_dict()).conflict is None
    with pytest.raises(ValueError, match=r"^conflict: expected a module-level function to serialise"):
        MDLGate(embedder="all-MiniLM-L6-v2", conflict=lambda texts: _every_pair_conflicts(texts)).to_dict()


def test_haystack_pipeline_with_the_component_writes_and_loads_its_config_path_and_risk_table(tmp_path):
    """Pipeline.dumps refused the component's own to_dict: an MDLConfig (not a YAML value), a risk
    table keyed by a number, a NumPy risk or a pathlib path."""
    import numpy as np

    from mdl_jax import save_config

    cfg = MDLConfig(sigma=0.3, thresholds=(0.7, 0.5, 0.3))
    saved = save_config(cfg, tmp_path / "config.json")
    mems, _ = CASES[Action.ACTIVE]
    for kwargs in ({"config": cfg, "risk": {1: 0.2, "Health": np.float32(0.85)}, "category": "1"},
                   {"config": saved, "risk": np.float64(0.2), "cache_dir": tmp_path}):
        gate = MDLGate(embedder="all-MiniLM-L6-v2", **kwargs)
        pipe = Pipeline()
        pipe.add_component("gate", gate)
        loaded = Pipeline.loads(pipe.dumps(), allowed_modules=["mdl_jax.integrations.haystack"]).get_component("gate")
        assert loaded.gate.config == cfg
        assert loaded.gate.risk("q", "1") == gate.gate.risk("q", "1") == pytest.approx(0.2)
        if isinstance(gate.risk, dict):
            assert loaded.gate.risk("q", "Health") == gate.gate.risk("q", "Health") == pytest.approx(0.85)


def _high_risk(query, category):
    """A risk assessor that pickles (module-level)."""
    return 0.85


@pytest.mark.parametrize("cls", [MDLDocumentCompressor, MDLNodePostprocessor])
def test_a_pickled_component_decides_as_the_original_or_pickling_fails(cls):
    """LangChain's component did not pickle at all (its gate holds closures); LlamaIndex's dropped a
    setting that did not pickle, with a logged warning: a lambda risk of 0.85 came back as 0.5."""
    import pickle

    mems, _ = CASES[Action.SILENT]
    comp = cls(embedder=_lookup, risk=_high_risk, category="c")
    again = pickle.loads(pickle.dumps(comp))
    assert again.risk is _high_risk and again.category == "c" and again.gate is not comp.gate
    want = comp.gate.decide("q", mems)
    got = again.gate.decide("q", mems)
    assert got.action == want.action == Action.SILENT and got.scalars == want.scalars
    with pytest.raises(Exception, match="risk: cannot be pickled" if cls is MDLNodePostprocessor else "pickle"):
        pickle.dumps(cls(embedder=_lookup, risk=lambda q, c: 0.85))
