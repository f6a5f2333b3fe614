"""FEMNIST writers as clients: splits inside writers, held-out writers, the FedGMM paper's
shift protocol, and the loader's checks."""

import numpy as np
import pytest

from fednovelty.datasets.femnist import (
    _split_sizes,
    make_femnist_federated,
    shift_writers,
    split_writers,
    transform_writer_images,
)
from fednovelty.datasets.loaders import load_femnist

SPLITS = ("train", "val", "test")


@pytest.fixture(scope="module")
def writers():
    return make_femnist_federated(6, random_state=0)


def rows(data, split):
    return [getattr(data, f"{name}_{split}") for name in ("X", "images", "y", "groups")]


def test_writers_are_clients_split_sixty_twenty_twenty(writers):
    raw = load_femnist()
    assert writers.n_writers == 6 and len(set(writers.writer_ids)) == 6
    for c, wid in enumerate(writers.writer_ids):
        n = int((raw["writer_ids"][raw["writer"]] == wid).sum())
        sizes = [int((getattr(writers, f"groups_{s}") == c).sum()) for s in SPLITS]
        assert sum(sizes) == n and tuple(sizes) == _split_sizes(n, 0.6, 0.2)
        # the writer's own images, each once: sorted pixel sums match the file's
        mine = np.concatenate(
            [getattr(writers, f"images_{s}")[getattr(writers, f"groups_{s}") == c] for s in SPLITS]
        )
        theirs = 255 - raw["X"][raw["writer_ids"][raw["writer"]] == wid]
        assert sorted(mine.reshape(n, -1).sum(1).tolist()) == sorted(
            theirs.reshape(n, -1).sum(1).tolist()
        )
    for split in SPLITS:
        X, images, y, groups = rows(writers, split)
        assert X.shape == (images.shape[0], 784) and images.dtype == np.uint8
        np.testing.assert_allclose(X, images.reshape(len(X), -1) / 255.0, rtol=1e-15)
        assert (np.diff(groups) >= 0).all() and y.dtype == np.int64 and y.max() < 62
    # MNIST's convention: the corners are background, dark
    assert writers.images_train[:, 0, 0].mean() < 10


def test_same_seed_same_writers_other_seed_other_writers(writers):
    again = make_femnist_federated(6, random_state=0)
    assert (again.writer_ids == writers.writer_ids).all()
    np.testing.assert_array_equal(again.y_test, writers.y_test)
    other = make_femnist_federated(6, random_state=1)
    assert set(other.writer_ids) != set(writers.writer_ids)


def test_digits_only_keeps_digit_classes():
    digits = make_femnist_federated(3, digits_only=True, random_state=0)
    assert digits.classes.tolist() == list(range(10))
    assert all(getattr(digits, f"y_{s}").max() < 10 for s in SPLITS)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_writers": 10_000}, "only .* writers have at least"),
        ({"n_writers": 0}, "n_writers must be a positive int"),
        ({"train": 0.8, "val": 0.3}, "train \\+ val must be below 1"),
        ({"train": 1.5}, "train must be a number in"),
        ({"min_rows": 2}, "min_rows must be an int >= 3"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_femnist_federated(**{"n_writers": 2, **kwargs})


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"femnist/femnist\.npz"):
        load_femnist(tmp_path)


def test_split_sizes_give_every_part_a_row():
    assert _split_sizes(3, 0.6, 0.2) == (1, 1, 1)
    assert _split_sizes(10, 0.6, 0.2) == (6, 2, 2)
    assert sum(_split_sizes(447, 0.6, 0.2)) == 447


def test_unseen_writers_are_held_out_whole(writers):
    seen, unseen = split_writers(writers, unseen=0.34, random_state=0)
    assert (seen.n_writers, unseen.n_writers) == (4, 2)
    assert not set(seen.writer_ids) & set(unseen.writer_ids)
    assert set(seen.writer_ids) | set(unseen.writer_ids) == set(writers.writer_ids)
    for part in (seen, unseen):
        for split in SPLITS:
            _, _, y, groups = rows(part, split)
            assert set(groups.tolist()) == set(range(part.n_writers))
            c = 0
            old = int(np.flatnonzero(writers.writer_ids == part.writer_ids[c])[0])
            np.testing.assert_array_equal(
                y[groups == c],
                getattr(writers, f"y_{split}")[getattr(writers, f"groups_{split}") == old],
            )
    assert sum(len(p.y_train) for p in (seen, unseen)) == len(writers.y_train)


def test_shift_transforms_images_and_permutes_their_labels(writers):
    shifted = shift_writers(writers, random_state=0)
    labels = {}
    for split in SPLITS:
        moved = shifted.shifted[split]
        before, after = getattr(writers, f"images_{split}"), getattr(shifted, f"images_{split}")
        np.testing.assert_array_equal(after[~moved], before[~moved])
        np.testing.assert_array_equal(after[moved], transform_writer_images(before[moved]))
        y0, y1 = getattr(writers, f"y_{split}"), getattr(shifted, f"y_{split}")
        np.testing.assert_array_equal(y1[~moved], y0[~moved])
        for a, b in zip(y0[moved], y1[moved], strict=True):
            assert labels.setdefault(int(a), int(b)) == int(b)  # one mapping for every row
    assert len(set(labels.values())) == len(labels)  # a permutation: no two classes merge
    per_writer = [shifted.shifted["train"][shifted.groups_train == c].mean() for c in range(6)]
    assert np.ptp(per_writer) > 0.1  # Beta(2, 2) shares differ between writers
    assert not shift_writers(writers, share=0, random_state=0).shifted["test"].any()
    assert shift_writers(writers, share=1, random_state=0).shifted["test"].all()
    with pytest.raises(ValueError, match="share must be 'beta' or a number"):
        shift_writers(writers, share=1.5)


def test_the_transform_inverts_flips_and_rotates():
    image = np.zeros((1, 3, 3), dtype=np.uint8)
    image[0, 0, 2] = 255  # top-right ink
    out = transform_writer_images(image)
    # inverted: ink -> background 0 at top-right, background -> 255; flipped: top-left;
    # rotated 90 degrees counter-clockwise: top-left goes to bottom-left
    assert out[0, 2, 0] == 0 and (out == 255).sum() == 8
