"""``draftwise serve``: an OpenAI-compatible HTTP server with lossless speculative decoding.

An optional part (``pip install draftwise[serve]``): nothing in the core imports it.

- :mod:`~draftwise.server.protocol` - request bodies that refuse what they cannot honour;
- :mod:`~draftwise.server.speculation` - which draft and k a request runs with (request, server
  default, or the plan's choice for its category);
- :mod:`~draftwise.server.worker` - the one model thread, its bounded FIFO queue, cancellation
  and timeouts;
- :mod:`~draftwise.server.responses` - OpenAI bodies and chunks with per-request statistics;
- :mod:`~draftwise.server.metrics` - Prometheus metrics named after vLLM's;
- :mod:`~draftwise.server.app` - the FastAPI app (``create_app``).
"""
