"""ClientApp: runs the algorithm's client step on this node's own rows.

By default the rows come from the node config: ``data-path`` (.npy, .npz with X [and y],
or .csv with a header) and the client id from ``partition-id``. To read data your own way,
pass a loader ``Context -> (client_id, rows)``, for example::

    import numpy as np
    from fednovelty.runtime.flower import make_client_app

    def load(context):
        part = int(context.node_config["partition-id"])
        rows = np.load(f"/data/site{part}.npy")  # (n_samples, n_features), float
        return part, rows

    app = make_client_app(load)
"""

from fednovelty.runtime.flower import make_client_app

app = make_client_app()
