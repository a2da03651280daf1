"""The engine benchmark's parts: the random model, the harness, the sections, the report (run ``experiments/bench_engine.py``)."""
