"""``python -m mdl_repro.serve``: the OpenAI-compatible local model server (``mdl_repro.model_server``)."""

from mdl_repro.model_server import main

if __name__ == "__main__":
    raise SystemExit(main())
