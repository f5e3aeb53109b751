"""Analyses of records: metrics, tables, figures and reports (imports the controller and the pipeline).

  report.py           RQ1: Tables 4-5 (both judges), Figure 3, REPORT.md
  oracle.py           Section 5.3 oracle labels, folds, scoring records with a run's configs
  complementarity.py  RQ2: Table 6 (signal subsets), low relevance, Table 10 (mutual information)
  ablation.py         RQ3: Table 7 (ablations; LR / MLP / XGBoost)
  sensitivity.py      Figure 5(b), σ and threshold sweeps (through ``mdl_jax.sweep``)
  figures.py, cases.py  Figures 4-6 and Section 6; case studies picked by rule
  latency.py          RQ4: Table 8 on the recorded signals
  stats.py            question-level tests, bootstrap intervals, small-n warnings
  judges.py           every judge against the gold set; rejudge()
  learned.py          the learned MDL beside Table 7 (``mdl-jax tune``)
  analyze.py          ``mdl-jax analyze``: all of RQ2-RQ4 → ANALYSIS.md
"""
