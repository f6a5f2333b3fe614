"""The steps that prepare a federated mixture fit, one module per protocol, and their settings.

Each protocol is a :class:`~fednovelty.federated.core.steps.Step` (or two) that federated EM
and its relatives chain before their own step, its progress kept in the algorithm's state:

- :mod:`.moments`: the ``moments`` round, pooled feature moments -> standardisation and
  covariance prior (:class:`~.moments.MomentsStep`).
- :mod:`.centroids`: k-FED seeds (``init_params="kmeans"``); :mod:`.separated`: centres
  far apart in the merged ranges (``"separated"``); :mod:`.given`: starts without a round
  (given parameters or means, public centres under differential privacy);
  :mod:`.assign`: the federated Lloyd rounds that follow them and give the initial mixture.
- :mod:`.subset`: raw rows fitted on the server (``"subset"``).
- :mod:`.chain`: :func:`~.chain.init_steps`, which of these a fit runs.
- :mod:`.combine`: the server's plain, robust or private sum of statistics replies.
- :mod:`.settings`: the settings groups (``MomentsSettings``, ``InitSettings``,
  ``GivenMixture``, ``PrivateSettings``); :mod:`.units`: public bounds and working units.

Every client half enforces the client's privacy policy (``docs/privacy.md``): it skips
below ``min_rows`` rows, forms at most ``min(n_components, max_clusters, n_rows //
min_rows)`` local clusters, sends ranges as the mean of the ``min_rows`` extreme values,
suppresses assignment statistics of centres backed by fewer than ``min_rows`` rows, and
refuses the ``subset`` round unless the policy allows raw rows. Importers name the module.
"""
