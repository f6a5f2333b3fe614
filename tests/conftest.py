"""Test-session policy shared by every test folder.

The suite runs as two pytest-xdist workers on a two-core machine. Each worker therefore
uses one torch intra-op thread: with more, the workers' OpenMP pools oversubscribe the
cores and small kernels (Cholesky of a 3x3, k-means on a few hundred rows) slow down by
one to two orders of magnitude while computing the same numbers.
"""

import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Files that hold a test marked ``slow`` run first, in collection order otherwise: with
    ``--dist loadfile`` the two workers start on the long files (the Flower deployments) and
    the many short ones fill in at the end, instead of one worker running the long files
    one after another while the other has nothing left."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
