from llama_index.core import VectorStoreIndex
from llama_index.core.schema import TextNode

from mdl_jax.evaluation.datasets.paper_sets import load
from mdl_jax.integrations.llamaindex import MDLNodePostprocessor, MiniLMEmbedding

items = load("truthfulqa", limit=40)  # the bundled TruthfulQA: answers become the memory store
nodes = [TextNode(text=a, metadata={"qid": it.qid, "kind": kind},
                  excluded_embed_metadata_keys=["qid", "kind"])  # embed the answer text alone
         for it in items for kind, answers in (("correct", it.correct), ("incorrect", it.incorrect))
         for a in answers[:2]]
index = VectorStoreIndex(nodes, embed_model=MiniLMEmbedding())
retriever = index.as_retriever(similarity_top_k=4)
gate = MDLNodePostprocessor(risk="truthfulqa")

for it in (items[1], items[2], items[14], items[31]):
    gate.category = it.category
    kept = gate.postprocess_nodes(retriever.retrieve(it.question), query_str=it.question)
    d = gate.last_decision
    print(f"{it.question[:50]!r}: {d.action_name}, C_final {d.scalars['C_final']:.2f}, kept {len(kept)}")
    for n in kept:
        print("   ", n.node.metadata["mdl_action"], n.node.metadata["kind"], n.node.get_content()[:60])
