"""The experiment pipeline, in data-flow order (each stage imported on use; most need torch):

  data.py → stores.py → store_signals.py   (M, R, A per question, computed by ``mdl_jax.signals``)
  generation.py              LLM backends (local transformers, OpenAI-compatible); the local server is mdl_jax/serving
  systems.py                 B1, B2, B3 (MDL), CRAG, Self-RAG
  judgement.py               hallucination scoring (the paper's rule and the ref judge), ``mdl-jax judge``
  records.py                 durable, resumable records
  experiment.py              the ``reproduce`` runner;  commands.py: the ``signals`` command
  defaults.py                the deployed n_min / n_max, recomputed from the calibration split
  resources/                 the judges' gold set; configs calibrated for the bundled model

It imports the controller (``mdl_jax``), the signal wing (``mdl_jax.signals``) and the action prompts
(``mdl_jax.prompts``), never the other way round.
"""
