"""ServerApp: runs the configured fednovelty algorithm's rounds and writes the result.

Everything is read from the run config (pyproject.toml's [tool.flwr.app.config] and
``flwr run --run-config`` overrides); the trained model lands in ``result-path``.
"""

from fednovelty.runtime.flower import make_server_app

app = make_server_app()
