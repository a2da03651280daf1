"""An OpenAI-compatible HTTP server over the step-wise decode loop (``python -m dlmsearch.serve``).

``protocol`` reads OpenAI's bodies and writes its responses and errors; ``lanes`` builds one
decoder, engine and plan per combination of settings, as the CLI composes a run;
``scheduler`` is the one decode loop that owns the model and batches requests continuously
over :class:`~dlmsearch.search.session.DecodeSession` s; ``metrics`` is ``/metrics``; ``engine``
is the engine process's side of the pipes to the fronts (submissions into jobs, results out as
token ids); ``app`` is a front: FastAPI's routes, tokenising and detokenising; ``__main__`` runs
the engine, starts ``serve.workers`` front processes on one port and drains on SIGTERM. See docs/serving.md.
"""
