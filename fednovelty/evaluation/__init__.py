"""Evaluation: novelty-detection metrics (positive class = novel, higher score = more anomalous).

Every function takes ``(y_true, scores)`` with ``y_true`` of shape ``(n_samples,)``, 1 = novel /
anomalous (the positive class) and 0 = inlier, and ``scores`` of shape ``(n_samples,)`` where
higher means more anomalous (PyOD's ``decision_function``).

- :mod:`~fednovelty.evaluation.metrics`: ``auroc``, ``aupr_in``, ``aupr_out``,
  ``fpr_at_95_tpr``, ``max_f1``, ``evaluate``.
- :mod:`~fednovelty.evaluation.benchmark`: ``run_benchmark`` (datasets x methods x protocols x
  alphas x clients x seeds -> tidy DataFrame, resumable); the methods are the registry's
  (:mod:`fednovelty.methods`, ``METHODS`` re-exported here);
  :mod:`~fednovelty.evaluation.ablations`: the ablations of the robust defaults it can run
  beside them (``ABLATIONS``; named ``"FedGenGMM-plain"``, ...).
- :mod:`~fednovelty.evaluation.results`: the results table's columns and its resumable CSV file.
- :mod:`~fednovelty.evaluation.summary`: ``summarize`` (markdown tables of a results table).
- :mod:`~fednovelty.evaluation.streams`: ``run_stream_benchmark`` (novelty under drift: the
  streaming detector, a static one and refits scored window by window on a two-domain stream
  -> tidy DataFrame), ``stream_summary`` and ``format_stream_summary``.
- :mod:`~fednovelty.evaluation.membership`: membership-inference attacks (``stats_attack``,
  ``gate_attack`` on what leaves a client's gate, ``score_attack`` on a detector's scores);
  :mod:`~fednovelty.evaluation.membership_bounds`: the bounds differential privacy puts on
  them (``gdp_auc_bound``, ``dp_auc_bound``); :mod:`~fednovelty.evaluation.membership_audit`:
  an attack's AUC, its error and the lower bound on epsilon its scores give.
- :mod:`~fednovelty.evaluation.plots`: ``plot_metric_vs`` (a metric vs alpha, clients or K, the
  FedGenGMM paper's Figs 3-5), ``plot_method_bars``, ``plot_stream_metric`` (a metric per
  window with the stream's share; matplotlib imported on call).
"""

from fednovelty.evaluation.benchmark import run_benchmark
from fednovelty.evaluation.membership import gate_attack, score_attack, stats_attack
from fednovelty.evaluation.membership_bounds import dp_auc_bound, gdp_auc_bound
from fednovelty.evaluation.metrics import aupr_in, aupr_out, auroc, evaluate, fpr_at_95_tpr, max_f1
from fednovelty.evaluation.plots import plot_method_bars, plot_metric_vs, plot_stream_metric
from fednovelty.evaluation.stream_summary import format_stream_summary, stream_summary
from fednovelty.evaluation.streams import run_stream_benchmark
from fednovelty.evaluation.summary import summarize
from fednovelty.methods import METHODS

__all__ = [
    "METHODS",
    "aupr_in",
    "aupr_out",
    "auroc",
    "dp_auc_bound",
    "evaluate",
    "format_stream_summary",
    "fpr_at_95_tpr",
    "gate_attack",
    "gdp_auc_bound",
    "max_f1",
    "plot_method_bars",
    "plot_metric_vs",
    "plot_stream_metric",
    "run_benchmark",
    "run_stream_benchmark",
    "score_attack",
    "stats_attack",
    "stream_summary",
    "summarize",
]
