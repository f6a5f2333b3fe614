"""Smoke test of ``benchmarks/dp_femnist.py`` (FEMNIST writers under DP on a public
projection): the quick run completes and prints its tables; the public maps checked against
independent references (scikit-learn's PCA, brute-force extremes, numpy norms)."""

import numpy as np
from sklearn.decomposition import PCA


def test_quick_run_prints_private_and_reference_rows(benchmark_script):
    report = benchmark_script("dp_femnist").main(["--quick"])
    table = report[report.index("## transforms: AUROC") : report.index("## transforms: AUC-PR")]
    assert "| setting | eps 1 | eps inf | eps fed. PCA |" in table
    rows = [line for line in table.splitlines() if line.startswith("| FedGMM")]
    assert len(rows) == 2  # FedGMM on MNIST's axes and on random axes
    for row in rows:
        values = [float(cell) for cell in row.strip("|").split("|")[1:]]
        assert len(values) == 3 and all(0.0 <= v <= 1.0 for v in values)
    # z at epsilon 1 over 44 releases, 5 % of the budget kept for the threshold
    assert "## Diagnosis" in report and "| FedGMM | 1 | 44.9 | 44 |" in report


def test_mnist_pca_axes_match_sklearn_on_the_directions(benchmark_script):
    module = benchmark_script("dp_femnist")
    rng = np.random.default_rng(0)
    pixels = rng.uniform(0, 1, (400, 30)) * (rng.uniform(0, 1, 30) > 0.3)
    projection = module.mnist_pca(pixels, n_axes=4)
    directions = pixels / np.linalg.norm(pixels, axis=1, keepdims=True)
    reference = PCA(4).fit(directions)
    overlap = np.abs(np.sum(projection.axes * reference.components_, axis=1))
    np.testing.assert_allclose(overlap, 1.0, atol=1e-8)
    np.testing.assert_allclose(projection.centre, directions.mean(axis=0), atol=1e-12)
    features = projection.features(pixels)
    np.testing.assert_allclose(np.abs(features[:, :4]), np.abs(reference.transform(directions)))
    np.testing.assert_allclose(features[:, 4], np.log(np.linalg.norm(pixels, axis=1)))


def test_random_projection_is_orthonormal_and_seeded(benchmark_script):
    module = benchmark_script("dp_femnist")
    a, b = module.random_projection(50, 6, 3), module.random_projection(50, 6, 3)
    np.testing.assert_allclose(a.axes @ a.axes.T, np.eye(6), atol=1e-12)
    np.testing.assert_array_equal(a.axes, b.axes)
    assert not np.allclose(a.axes, module.random_projection(50, 6, 4).axes)


def test_algebraic_box_holds_every_image_and_is_reached(benchmark_script):
    module = benchmark_script("dp_femnist")
    rng = np.random.default_rng(1)
    n_pixels = 16
    projection = module.random_projection(n_pixels, 3, 0)
    projection = module.Projection("random", rng.uniform(0, 0.2, n_pixels), projection.axes)
    low, high = module.algebraic_box(projection, n_pixels)
    images = rng.uniform(0, 1, (5000, n_pixels)) * (rng.uniform(0, 1, (5000, n_pixels)) > 0.5)
    images = np.vstack([images, np.ones((1, n_pixels)), np.eye(n_pixels) / 255.0])
    features = projection.features(images)
    assert (features >= low - 1e-12).all() and (features <= high + 1e-12).all()
    # the extreme of a . u over non-negative unit u is the positive part's direction
    for j, axis in enumerate(projection.axes):
        best = np.clip(axis, 0, None)
        top = projection.features(best[None] / np.linalg.norm(best))[0, j]
        np.testing.assert_allclose(top, high[j], rtol=1e-12)
    np.testing.assert_allclose([low[-1], high[-1]], [np.log(1 / 255), np.log(4.0)])


def test_public_clip_is_the_largest_public_norm_in_box_units(benchmark_script):
    module = benchmark_script("dp_femnist")
    rng = np.random.default_rng(2)
    public = rng.normal(0, [1.0, 3.0], (200, 2))
    box = module.public_box(public)
    np.testing.assert_array_equal(box[0], public.min(axis=0))
    scaled = (public - (box[0] + box[1]) / 2) / ((box[1] - box[0]) / 2)
    assert np.abs(scaled).max() <= 1 + 1e-12
    expected = max(float(np.hypot(*row)) for row in scaled)
    np.testing.assert_allclose(module.public_clip(public, box), expected, rtol=1e-12)
