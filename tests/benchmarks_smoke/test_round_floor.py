"""``benchmarks.round_floor``: the parts a federated round of many clients cannot skip."""

from __future__ import annotations

import re

import torch

from fednovelty.mixture import MixtureParams, precisions_cholesky_from_precisions


def test_the_floor_line_times_every_part_against_the_centralized_iteration(benchmark_script):
    floor = benchmark_script("round_floor")
    generator = torch.Generator().manual_seed(0)
    pooled = torch.randn(600, 4, dtype=torch.float64, generator=generator)
    clients = list(pooled.split(30))  # 20 clients
    params = MixtureParams(
        torch.full((3,), 1 / 3, dtype=torch.float64),
        pooled[:3].clone(),
        precisions_cholesky_from_precisions(
            torch.eye(4, dtype=torch.float64).repeat(3, 1, 1), "full"
        ),
        "full",
    )
    line = floor.floor_line(pooled, clients, params, central_s=0.5)
    assert "60 Cholesky factorisations of 4 x 4" in line
    parts = re.findall(r"(\d+\.\d+) s \((\d+\.\d+)x\)", line)
    assert len(parts) == 4
    for seconds, ratio in parts:  # each part as a multiple of the 0.5 s given
        assert abs(float(ratio) - float(seconds) / 0.5) <= 0.01
    total = re.search(r"= (\d+\.\d+)x$", line)
    pooled_e, _, cholesky, copy = (float(s) for s, _ in parts)
    assert abs(float(total.group(1)) - (pooled_e + cholesky + copy) / 0.5) <= 0.02


def test_the_matrices_factorised_are_positive_definite(benchmark_script):
    grams = benchmark_script("round_floor").positive_definite(50, 8)
    assert grams.shape == (50, 8, 8) and grams.dtype == torch.float64
    assert torch.equal(grams, grams.transpose(-1, -2))
    assert (torch.linalg.eigvalsh(grams) > 0).all()
