"""Helpers of the fednovelty Streamlit dashboard (``app/``), kept out of the page scripts.

- :mod:`~fednovelty_app.data`: data sources (the FedGMM paper's synthetic clients, ADBench
  tasks from ``../shared/data``, uploaded tables) turned into one :class:`DataBundle`.
- :mod:`~fednovelty_app.uploads`: reading uploaded tables and the checks that turn a bad
  upload into a message naming the column, row or client instead of a traceback.
- :mod:`~fednovelty_app.training`: the settings of a run from the method registry, building
  and fitting a detector, and model files (safetensors) in and out.
- :mod:`~fednovelty_app.progress`: per-round progress of a fit.
- :mod:`~fednovelty_app.analysis`: the numbers each page shows (scores, curves, confusion
  counts, per-client AUROC, the joint view, unseen-client adaptation, scoring new rows).
- :mod:`~fednovelty_app.drift`, :mod:`~fednovelty_app.clusters`: the Drift and Clusters
  pages' synthetic clients and the numbers they show.
- :mod:`~fednovelty_app.plots`: Plotly figures built from those numbers.
- :mod:`~fednovelty_app.ui`: the few Streamlit-specific pieces shared by the pages.

Everything except ``ui`` is plain Python (no Streamlit) and unit-tested on its own. The app
sits on top of the package and uses only its public API: ``fednovelty`` detectors and
``load``, ``fednovelty.datasets``, ``fednovelty.datasets.protocols.make_task`` and
``fednovelty.evaluation``. This module imports nothing heavy, so the first page loads fast.
"""
