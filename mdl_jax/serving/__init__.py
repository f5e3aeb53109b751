"""Servers that speak the OpenAI protocol: the local model server (``python -m mdl_jax.serve``) and
the MDL gateway (``mdl-jax gateway``). A leaf wing: FastAPI / uvicorn / httpx (the ``serve`` extra)
are imported here only, never by the controller or the pipeline.

  protocol.py      request models, OpenAI-shaped errors, limits, the body reader, server-sent events
  model_server.py  a LocalBackend model behind /v1/chat/completions, /v1/completions, /v1/models
  gateway.py       MDL in front of any OpenAI-compatible upstream
"""
