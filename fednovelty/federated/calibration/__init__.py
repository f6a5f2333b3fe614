"""Calibration: the federation's histogram of calibration scores for split-conformal
thresholds and p-values (``quantile``; the formulas are ``core.conformal``'s)."""
