"""An OpenAI-compatible HTTP server over the step-wise decode loop (``python -m dlmsearch.serve``).

``protocol`` reads OpenAI's bodies and writes its responses and errors; ``lanes`` builds one
decoder, engine and plan per combination of settings, as the CLI composes a run;
``scheduler`` is the one decode loop that owns the model and batches requests continuously
over :class:`~dlmsearch.search.session.DecodeSession` s; ``metrics`` is ``/metrics``; ``app`` is
FastAPI's routes; ``__main__`` starts uvicorn and drains on SIGTERM. See docs/serving.md.
"""
