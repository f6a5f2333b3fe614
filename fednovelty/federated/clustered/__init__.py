"""Clustered federations: clustered additive Gaussian mixtures and the Fed-CAM paper's
classification methods."""
