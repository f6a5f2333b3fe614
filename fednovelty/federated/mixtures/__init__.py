"""Gaussian mixtures fitted by federated EM (FedGMM, DEM), one-shot FedGenGMM and federated PCA."""
