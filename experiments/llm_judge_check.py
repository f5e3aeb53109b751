"""Can the bundled SmolLM2-135M serve as a judge? A check against the shipped gold set.

    python -m experiments.llm_judge_check        # about 5-10 min on the 2-core CPU

Each gold record becomes one chat prompt (question, up to three correct and three wrong references, the
candidate answer: "Does the candidate answer state something false about what the question asks? Reply
Yes or No.") and the reply is decided by label likelihood (``LocalBackend.score``, the mechanism CRAG
and Self-RAG use). Prints, per dataset, the agreement of the argmax label with the gold label and the
agreement at the best threshold on the Yes − No log-likelihood margin chosen on the same records (an
optimistic upper bound). Measured 2026-11-30 on the 482 gold records: argmax 0.397 (HaluEval) and 0.442
(TruthfulQA), Yes for 0-0.4% of answers; best threshold 0.628 / 0.575. Both rule judges do better
(``mdl_repro.analysis.judges``), which is why the ``ref`` judge uses no LLM.
"""

from __future__ import annotations

import numpy as np

PROMPT = ("Question: {q}\nCorrect answer: {c}\nA wrong answer: {i}\n\nCandidate answer: {a}\n\n"
          "Does the candidate answer state something false about what the question asks? Reply Yes or No.")


def main(argv=None) -> int:
    import argparse

    # Parse before anything heavy: `--help` must describe the job, not start it.
    argparse.ArgumentParser(prog="python -m experiments.llm_judge_check",
                            description=__doc__.split("\n\n", 2)[0] + " Loads the bundled SmolLM2 "
                            "and scores the 482 gold answers: about 5-10 minutes on a 2-core CPU. "
                            "For any OpenAI-compatible server use `mdl-jax judge GOLD --judge llm`.",
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    from mdl_repro.analysis.judges import dataset_items, load_gold
    from mdl_repro.pipeline.generation import LocalBackend

    g = load_gold()
    pools = dataset_items(g["dataset"])
    prompts = []
    for d, q, a in zip(g["dataset"], g["qid"], g["answer"]):
        it = pools[d][q]
        prompts.append([{"role": "user", "content": PROMPT.format(
            q=it.question, c="; ".join(it.correct[:3]), i="; ".join(it.incorrect[:3]), a=a[:600])}])
    sc = np.array(LocalBackend().score(prompts, ["Yes", "No"]))
    g["llm"] = sc[:, 0] > sc[:, 1]
    g["margin"] = sc[:, 0] - sc[:, 1]
    g["gold"] = g["label"].eq("hallucinated")
    for ds, d in g.groupby("dataset"):
        k = int((d["llm"] == d["gold"]).sum())
        best = max(float(((d["margin"] > t) == d["gold"]).mean()) for t in np.unique(d["margin"]))
        print(f"{ds}: argmax {k}/{len(d)} = {k / len(d):.3f} (Yes for {d['llm'].mean():.1%}); "
              f"best threshold on the margin (in-sample) {best:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
