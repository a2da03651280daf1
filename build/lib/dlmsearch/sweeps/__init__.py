"""Sweeps: experiment presets (``conf/experiment/``), their collection into ``sweep.csv``,
``sweep.md`` and plots (``collect``, also as the Hydra callback ``callback.CollectSweep``), the
statistics that go with them (``stats``).

``python -m dlmsearch -m +experiment=ablate_gate`` runs a grid and collects it at the end;
``python -m dlmsearch.sweeps.collect SWEEP_DIR [--baseline ...]`` collects any sweep directory.
"""
