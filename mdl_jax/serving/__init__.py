"""The MDL gateway (``mdl-jax gateway``), which speaks the OpenAI protocol. A leaf wing: FastAPI / uvicorn /
httpx (the ``serve`` extra) are imported here only, never by the controller or the gate. The local model
server that also speaks it is part of the paper's reproduction (``python -m mdl_repro.serve``).

  protocol.py      request models, OpenAI-shaped errors, limits, the body reader, server-sent events
  connections.py   the HTTP server both servers run on: uvicorn with the connection guards and deadlines
  gateway.py       MDL in front of any OpenAI-compatible upstream
  model_server.py  a deprecated alias of ``mdl_repro.model_server``
"""
