"""Metrics of any gate on the same records, with intervals from a bootstrap over questions.

Every function takes columns: NumPy arrays (or anything ``np.asarray`` reads: lists, pandas Series) of
shape (N,), one value per record, all of the same length. A record is one answer to one question; a
question may have several records (seeds, memory sets), and those records are not independent, so every
interval resamples whole questions (``groups``), never single records.

Sign convention. A gate's ``score`` is one number per record, and by default a higher score means the
positive class of the metric: "do not adopt" (the memories are withheld) for a memory gate, "abstain" for
a selective answerer, "retrieve" for the adaptive-retrieval metrics. A score that runs the other way (a
confidence: higher = adopt / answer) is passed with ``higher_is="negative"``, which negates it; nothing is
inferred from the values. A ``label`` is binary (bool or 0/1) and 1 marks the positive class ("should not
adopt", "should abstain"). ``correct`` is binary: 1 where the answer the system gives (or would give, had it
answered) is right. ``abstained`` is binary: 1 where the system gave no answer.

The package, one job per module (each module's docstring gives its definitions):

  columns      the checks every metric runs on its columns, and the orientation of a score
  ranking      AUROC, AUPRC (and AUROC under record weights)
  abstention   AbstentionBench's precision, recall, F1 and over-refusal rate of abstaining
  selective    coverage, selective accuracy and risk, the risk–coverage curve and AURC
  retrieval    AdaRAGUE's In-Accuracy, retrieval calls, oracle and self-knowledge ROC-AUC; CRAG's score
  intervals    ``bootstrap`` of any metric, ``paired_difference`` of two gates, the minimum detectable
               difference (``mde``, ``mde_for``)
  table        ``evaluate``: every gate column of a table, the whole set at once
  clustered    the record-level helpers the analyses of records use (``cluster_se``,
               ``cluster_bootstrap_diff``, ``question_bootstrap_weights``, ``bootstrap_mean_ci``)

Every public name is importable from here (``from mdl_jax.evaluation.metrics import auroc``), which is
the path callers use.
"""

from __future__ import annotations

from mdl_jax.evaluation.metrics.abstention import (
    abstention_f1,
    abstention_precision,
    abstention_recall,
    over_refusal_rate,
)
from mdl_jax.evaluation.metrics.clustered import (
    bootstrap_mean_ci,
    cluster_bootstrap_diff,
    cluster_se,
    question_bootstrap_weights,
)
from mdl_jax.evaluation.metrics.columns import NAN, RULES, SIGNS
from mdl_jax.evaluation.metrics.intervals import (
    MIN_GROUPS_Z,
    N_BOOT,
    Z_A,
    Z_B,
    Difference,
    Estimate,
    bootstrap,
    mde,
    mde_for,
    paired_difference,
)
from mdl_jax.evaluation.metrics.ranking import auprc, auroc, auroc_weighted
from mdl_jax.evaluation.metrics.retrieval import (
    crag_score,
    in_accuracy,
    retrieval_auroc,
    retrieval_calls,
    retrieval_oracle,
)
from mdl_jax.evaluation.metrics.selective import (
    Curve,
    aurc,
    coverage,
    rates,
    risk_coverage,
    selective_accuracy,
    selective_risk,
)
from mdl_jax.evaluation.metrics.table import evaluate

__all__ = [
    "Curve", "Difference", "Estimate", "MIN_GROUPS_Z", "NAN", "N_BOOT", "RULES", "SIGNS", "Z_A", "Z_B",
    "abstention_f1", "abstention_precision", "abstention_recall", "aurc", "auprc", "auroc",
    "auroc_weighted", "bootstrap", "bootstrap_mean_ci", "cluster_bootstrap_diff", "cluster_se", "coverage",
    "crag_score", "evaluate", "in_accuracy", "mde", "mde_for", "over_refusal_rate", "paired_difference",
    "question_bootstrap_weights", "rates", "retrieval_auroc", "retrieval_calls", "retrieval_oracle",
    "risk_coverage", "selective_accuracy", "selective_risk",
]
