"""Test-session policy shared by every test folder.

The suite runs as two pytest-xdist workers on a two-core machine. Each worker therefore
uses one torch intra-op thread: with more, the workers' OpenMP pools oversubscribe the
cores and small kernels (Cholesky of a 3x3, k-means on a few hundred rows) slow down by
one to two orders of magnitude while computing the same numbers.
"""

import torch

torch.set_num_threads(1)
