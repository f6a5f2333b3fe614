"""Reduced FedGMM novelty experiments on real MNIST with ``JointFedGMMDetector``
(python -m benchmarks.fedgmm_mnist at full size).

Floors are the measured values at this size minus a margin; the full-size figures are in
benchmarks/results/fedgmm_mnist.md.
"""

import numpy as np
import pytest

from fednovelty import JointFedGMMDetector
from fednovelty.datasets import make_mnist_federated, permute_labels, transform_images
from fednovelty.detectors.options import Training
from fednovelty.evaluation.metrics import auroc


def unit_norm(rows):
    """Per-image L2 normalisation (each client applies it to its own rows)."""
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def flat(images):
    return unit_norm(images.reshape(len(images), -1) / 255.0)


def small_detector():
    return JointFedGMMDetector(
        6,
        n_learners=1,
        pca_components=16,
        max_iter=15,
        random_state=0,
        training=Training(local_epochs=1, learning_rate=1.0),
    )


def test_transformed_digits_are_novel_in_x():
    """10 clients x 200 images: rotated, scaled, flipped digits are novel in x."""
    # floors from the measured AUROC px 0.992, pxy 0.994, msp 0.61
    data = make_mnist_federated(10, 200, 0.4, random_state=0)
    detector = small_detector().fit(unit_norm(data.X_train), data.y_train, groups=data.groups_train)
    ood = flat(transform_images(data.images_test, ["scale", "rotate", "hflip"]))
    X = np.vstack([unit_norm(data.X_test), ood])
    y = np.concatenate([data.y_test, data.y_test])
    novel = np.r_[np.zeros(len(data.X_test)), np.ones(len(ood))]
    by_score = {s: auroc(novel, detector.decision_function(X, y, score=s)) for s in ("px", "pxy")}
    assert by_score["px"] >= 0.97, by_score
    assert by_score["pxy"] >= 0.97, by_score
    assert by_score["px"] > auroc(novel, detector.decision_function(X, score="msp")) + 0.2


@pytest.fixture(scope="module")
def without_ones():
    data = make_mnist_federated(10, 200, 0.4, exclude_digits=(1,), random_state=1)
    detector = small_detector().fit(unit_norm(data.X_train), data.y_train, groups=data.groups_train)
    return data, detector


def test_leave_one_digit_out_separates_the_two_kinds_of_novelty(without_ones):
    data, detector = without_ones
    X = unit_norm(data.X_test)
    ones = flat(data.excluded["images"][:300])
    permuted, _ = permute_labels(np.searchsorted(detector.classes_, data.y_test), random_state=0)
    permuted = detector.classes_[permuted]
    unseen_digit = auroc(
        np.r_[np.zeros(len(X)), np.ones(len(ones))],
        -np.r_[detector.log_px(X), detector.log_px(ones)],
    )
    wrong_label = auroc(
        np.r_[np.zeros(len(X)), np.ones(len(X))],
        -np.r_[detector.log_py_given_x(X, data.y_test), detector.log_py_given_x(X, permuted)],
    )
    # measured: digit 1 by log p(x) 0.890, permuted labels by log p(y|x) 0.973
    assert unseen_digit >= 0.85, unseen_digit
    assert wrong_label >= 0.94, wrong_label
    with pytest.raises(ValueError, match=r"label\(s\) \[1\] not seen in fit"):
        detector.log_py_given_x(ones[:2], [1, 1])
