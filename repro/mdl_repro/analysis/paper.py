"""The paper's reported figures that the reports print beside ours, and the systems' display names.

A module of constants only, so that every analysis (the report, the statistics) can import it without
importing each other."""

PAPER_TABLE4 = {  # deepseek-v4-flash, 200 questions × 3 seeds: (TQA overall, TQA high, HE overall, HE high)
    "B1": (0.160, 0.124, 0.083, 0.040), "B2": (0.043, 0.107, 0.065, 0.027),
    "B3": (0.047, 0.000, 0.070, 0.013),
}
PAPER_TABLE5 = {  # TruthfulQA, deepseek-v4-flash, 200 × 2: (overall, high-risk, refusal)
    "B1": (0.155, 0.110, 0.380), "B2": (0.048, 0.119, 0.880), "CRAG": (0.050, 0.059, 0.645),
    "SelfRAG": (0.005, 0.000, 0.833), "B3": (0.048, 0.000, 0.877),
}
PAPER_FIG3A = {  # gemma-4-E4B-it, TruthfulQA: overall / high-risk hallucination rates quoted in 5.2
    "B1": {"overall": 0.230}, "B2": {"overall": 0.530, "0.5": 0.526, "0.85": 0.630},
    "B3": {"overall": 0.233, "0.5": 0.276, "0.85": 0.0},
}
NAMES = {"B1": "B1 (no memory)", "B2": "B2 (standard RAG)", "B3": "B3 (MDL)",
         "CRAG": "CRAG (prompt-based)", "SelfRAG": "Self-RAG (prompt-based)"}
