from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
from haystack.document_stores.in_memory import InMemoryDocumentStore

from mdl_jax.evaluation.datasets.paper_sets import load
from mdl_jax.integrations.haystack import MDLGate

items = load("truthfulqa", limit=40)  # the bundled TruthfulQA: answers become the memory store
store = InMemoryDocumentStore()
store.write_documents([Document(content=a, meta={"qid": it.qid, "kind": kind})
                       for it in items for kind, answers in (("correct", it.correct),
                                                             ("incorrect", it.incorrect))
                       for a in answers[:2]])
pipe = Pipeline()
pipe.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=4))
pipe.add_component("gate", MDLGate(risk="truthfulqa"))
pipe.connect("retriever.documents", "gate.documents")

for it in (items[1], items[2], items[14], items[31]):
    out = pipe.run({"retriever": {"query": it.question},
                    "gate": {"query": it.question, "category": it.category}})
    d, kept = out["gate"]["decision"], out["gate"]["documents"]
    print(f"{it.question[:50]!r}: {d['action']}, C_final {d['scalars']['C_final']:.2f}, kept {len(kept)}")
    for doc in kept:
        print("   ", doc.meta["mdl_action"], doc.meta["kind"], doc.content[:60])
