"""Bayesian mixtures: exact and one-shot federated variational Bayes, federated kNN-distance
markers (a one-column variational mixture) and VGM2's mixture relation markers."""
