"""The package's top level: detectors load lazily, and the names it promises resolve."""

import subprocess
import sys

import pytest


def test_algorithm_layers_do_not_import_pyod():
    code = (
        "import sys, fednovelty, fednovelty.federated, fednovelty.runtime; "
        "print('pyod' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_public_names_resolve():
    import fednovelty
    from fednovelty.detectors import FedGMMDetector

    assert fednovelty.FedGMMDetector is FedGMMDetector
    assert set(fednovelty.__all__) <= set(dir(fednovelty))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        fednovelty.Nope  # noqa: B018
