"""The experiment pipeline, in data-flow order (each stage imported on use; most need torch):

  data.py → stores.py → store_signals.py   (M, R, A per question, computed by ``mdl_jax.signals``)
  generation/                LLM backends: local transformers (local.py, loading.py), OpenAI-compatible
                             (openai_client.py), paired sampling (sampling.py), the run's answer cache
                             (cache.py); the local server is mdl_jax/serving
  systems.py                 B1, B2, B3 (MDL), CRAG, Self-RAG
  judgement.py               hallucination scoring (the paper's rule and the ref judge), ``mdl-jax judge``
  judgement_llm.py           the judge that asks a strong model (``--judge llm``)
  records.py                 durable, resumable records
  experiment.py              the ``reproduce`` runner (the command itself is repro/mdl_repro/cli/experiment.py)
  gate_scores.py             ``score-gates``: the practitioners' gates' inputs, scored from a run's records
  stage_latency.py           Table 8's stages timed on a run's stores and models (``analyze --latency``)
  defaults.py                the deployed n_min / n_max, recomputed from the calibration split
  resources/                 the judges' gold set; configs calibrated for the bundled model

It imports the controller (``mdl_jax``), the signal wing (``mdl_jax.signals``) and the action prompts
(``mdl_jax.prompts``), never the other way round.
"""

# The controller engine of the reproduction's batch decisions (B3's actions, the analyses' re-scoring,
# sweeps and figures): "auto" takes the native kernel where it runs, as every committed run's records and
# reports were computed, so that they regenerate bit for bit; the pure-JAX default can differ from it
# in the last float32 bit, which moves an action only where C_final sits on a threshold.
ENGINE = "auto"
