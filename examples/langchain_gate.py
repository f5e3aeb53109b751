from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from mdl_jax.evaluation.datasets.paper_sets import load
from mdl_jax.integrations.langchain import MDLDocumentCompressor, MiniLMEmbeddings

items = load("truthfulqa", limit=40)  # the bundled TruthfulQA: answers become the memory store
docs = [Document(page_content=a, metadata={"qid": it.qid, "kind": kind})
        for it in items for kind, answers in (("correct", it.correct), ("incorrect", it.incorrect))
        for a in answers[:2]]
store = InMemoryVectorStore.from_documents(docs, MiniLMEmbeddings())
retriever = store.as_retriever(search_kwargs={"k": 4})
gate = MDLDocumentCompressor(risk="truthfulqa")

for it in (items[1], items[2], items[14], items[31]):
    gate.category = it.category  # the TruthfulQA risk table reads the question's category
    kept = gate.compress_documents(retriever.invoke(it.question), it.question)
    d = gate.last_decision
    print(f"{it.question[:50]!r}: {d.action_name}, C_final {d.scalars['C_final']:.2f}, kept {len(kept)}")
    for doc in kept:
        print("   ", doc.metadata["mdl_action"], doc.metadata["kind"], doc.page_content[:60])
    if d.action_name == "Opt-Out":
        print("    answer without calling the model:", d.abstention[:40])

# With the full LangChain (`langchain_classic`, in the extra), the same compressor in its retriever:
try:
    from langchain_classic.retrievers import ContextualCompressionRetriever
except ImportError:
    ContextualCompressionRetriever = None
if ContextualCompressionRetriever is not None:
    gated = ContextualCompressionRetriever(base_compressor=gate, base_retriever=retriever)
    kept = gated.invoke(items[0].question)
    print("ContextualCompressionRetriever:", gate.last_decision.action_name, len(kept), "documents")
