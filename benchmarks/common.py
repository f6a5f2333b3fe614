"""What the benchmark scripts share: their options, summaries, tables, data and report.

- Options: :func:`add_seeds`, :func:`add_quick`, :func:`add_out`, :func:`add_threads`,
  :func:`add_device` add the arguments most scripts take; :func:`quick_seeds` is the seed
  tuple of a run (the first seed only under ``--quick``); :func:`command_line` is the
  command a report names.
- Summaries: :func:`mean_std` (``mean ± std`` over seeds), :func:`markdown_table` (the one
  markdown-table writer), :func:`check` (a ``PASS`` / ``FAIL`` line), :func:`pooled_accuracy`,
  :func:`personal_accuracy`.
- Data: :func:`standardise_images` and :func:`standardised` (FEMNIST / MNIST images, each
  to zero mean and unit variance), :func:`shifted_writers` (the FedGMM paper's FEMNIST
  writers).
- Machine and report: :func:`machine_facts`, :func:`device_facts`, :func:`check_device`,
  :func:`report_header`, :func:`emit_report`.
- Paper tables: :class:`PaperTables` specifies a script's experiments (per-seed data, one
  run and one report section per experiment); :func:`run_paper_tables` runs the chosen ones
  and writes the report, :func:`add_experiment` adds the ``--experiment`` option.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import sklearn
import torch

#: where a benchmark may fit: ``--device`` takes one of these.
DEVICES = ("cpu", "cuda")
#: the repository's root (the folder holding ``benchmarks/`` and ``fednovelty/``).
REPO = Path(__file__).resolve().parents[1]
#: the folder the scripts write their reports under by default.
RESULTS = REPO / "benchmarks" / "results"


# ----------------------------------------------------------------------------- options
def add_seeds(parser: argparse.ArgumentParser, default=(0, 1, 2), help: str | None = None):
    """``--seeds S [S ...]``: the seeds to run (a list of ints; ``default`` when not given)."""
    parser.add_argument("--seeds", type=int, nargs="+", default=list(default), help=help)


def add_quick(parser, help: str | None = None, group=None) -> None:
    """``--quick``: the script's smoke run (added to ``group`` when given, e.g. an exclusive
    group beside ``--paper-scale``)."""
    (group or parser).add_argument("--quick", action="store_true", help=help)


def add_out(parser, help: str | None = None, default: Path | None = None) -> None:
    """``--out PATH``: where the report goes (``default``; ``None``: only printed)."""
    parser.add_argument("--out", type=Path, default=default, help=help)


def add_threads(parser, default: int = 1, help: str | None = None) -> None:
    """``--threads N``: torch threads of the run."""
    parser.add_argument("--threads", type=int, default=default, help=help)


def add_device(parser, help: str | None = None) -> None:
    """``--device cpu|cuda``: where the detectors compute (default ``cpu``)."""
    parser.add_argument("--device", choices=DEVICES, default="cpu", help=help)


def add_checkpoints(parser, help: str | None = None) -> None:
    """``--checkpoints DIR``: keep each finished unit in ``DIR`` and resume from it
    (:mod:`benchmarks.checkpoints`); default none (nothing kept)."""
    parser.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        help=help or "keep finished seeds (and fits) in DIR; a later run resumes from them",
    )


def quick_seeds(seeds: Sequence[int], quick: bool) -> tuple[int, ...]:
    """The seeds a run uses: all of ``seeds``, or only the first under ``--quick``."""
    return (seeds[0],) if quick else tuple(seeds)


def command_line(name: str, argv: Sequence[str] | None = None) -> str:
    """``python -m benchmarks.<name> <args>``: the command a report names (``argv``, or the
    process's own arguments when ``None``)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return f"python -m benchmarks.{name} " + " ".join(args)


# ----------------------------------------------------------------------------- summaries
def mean_std(values, digits: int = 1, *, ddof: int = 1, sep: str = " ± ", empty: str = "-") -> str:
    """``mean ± std`` of ``values`` (NaN dropped) with ``digits`` decimals.

    ``ddof`` is the standard deviation's (1: the sample's, 0: the population's); with no more
    values than ``ddof`` only the mean is shown. ``sep`` joins the two, ``empty`` stands for
    no values.
    """
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return empty
    mean = float(np.mean(values))
    if values.size <= ddof:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f}{sep}{float(np.std(values, ddof=ddof)):.{digits}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table: one ``header`` line, the rule, then ``rows`` (cells as ``str(x)``)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def check(label: str, ok: bool) -> str:
    """One checklist line: ``- PASS: label`` or ``- FAIL: label``."""
    return f"- {'PASS' if ok else 'FAIL'}: {label}"


def personal_accuracy(model, X, y, groups) -> float:
    """Sample-weighted accuracy in %, each client's rows predicted with its own weights
    (``model.predict_y(X_c, client=c)``); ``X`` (n, d), ``y`` and ``groups`` (n,)."""
    correct = sum(
        int((model.predict_y(X[groups == c], client=c) == y[groups == c]).sum())
        for c in np.unique(groups)
    )
    return 100.0 * correct / len(y)


def pooled_accuracy(parts: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Total correct over total rows of ``(predicted, true)`` pairs, in %."""
    correct = sum(int((pred == true).sum()) for pred, true in parts)
    return 100.0 * correct / sum(len(true) for _, true in parts)


# ----------------------------------------------------------------------------- data
def standardise_images(X: np.ndarray) -> np.ndarray:
    """Each row (an image) to zero mean and unit variance on its own: (n, d) -> (n, d)."""
    return (X - X.mean(1, keepdims=True)) / np.maximum(X.std(1, keepdims=True), 1e-6)


def standardised(data):
    """FEMNIST ``data`` (a ``FederatedWriters``) with every split's rows standardised image by
    image (``split_writers`` rebuilds rows from the images, so this comes after any split)."""
    rows = {f"X_{s}": standardise_images(getattr(data, f"X_{s}")) for s in ("train", "val", "test")}
    return dataclasses.replace(data, **rows)


def shifted_writers(n_writers: int, seed: int):
    """The FedGMM paper's FEMNIST federation: ``n_writers`` writers of a seeded draw, each
    shifted by its own seeded transform (rows as pixels / 255: standardise after splitting)."""
    from fednovelty.datasets.femnist import make_femnist_federated, shift_writers

    return shift_writers(make_femnist_federated(n_writers, random_state=seed), random_state=seed)


# ----------------------------------------------------------------------------- machine, report
def machine_facts() -> str:
    """One line: library versions, torch threads, CPU model and count, load average."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"torch {torch.__version__} (threads={torch.get_num_threads()}), "
        f"scikit-learn {sklearn.__version__}, numpy {np.__version__}, "
        f"python {platform.python_version()}; CPUs={os.cpu_count()} ({cpu}); "
        f"load average {load}"
    )


def device_facts(device: str) -> str:
    """The device a benchmark fitted on: ``"cpu"``, or ``"cuda (<the GPU's name>)"``.

    Raises:
        ValueError: ``device`` is ``"cuda"`` and no CUDA device is seen.
    """
    if device not in DEVICES:
        raise ValueError(f"--device must be 'cpu' or 'cuda'; got {device!r}.")
    if device == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device; use --device cpu.")
    return f"cuda ({torch.cuda.get_device_name(0)})"


def check_device(parser, device: str) -> None:
    """Stop ``parser`` with a usage error when ``--device cuda`` is asked and no GPU is seen."""
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu.")


def report_header(title: str, command: str, quick: bool, seconds: float) -> str:
    """A report's first lines: title, the command that ran, date, machine, runtime."""
    return "\n".join(
        [
            f"# {title}",
            "",
            f"- command: `{command.strip()}`" + (" (quick smoke run)" if quick else ""),
            f"- date: {datetime.date.today().isoformat()}",
            f"- {machine_facts()}",
            f"- total runtime: {seconds / 60:.1f} min; load average at the end "
            f"{os.getloadavg()[0]:.1f}",
        ]
    )


def emit_report(report: str, out: Path | None) -> str:
    """Print ``report``, also write it to ``out`` (its folder made) when given; return it."""
    print()
    print(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
    return report


# ----------------------------------------------------------------------------- paper tables
@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment of a paper-table script.

    Attributes:
        name: its ``--experiment`` choice.
        title: the line printed when it starts.
        run_seed: ``run_seed(data, settings, seed)``: the seed's results (what ``report`` reads).
        report: ``report(per_seed, settings)``: its report section from the per-seed results.
        data: ``data(settings, seed)``: the experiment's own data of a seed, built when the
            seed starts; ``None``: the :class:`PaperTables`' shared data.
    """

    name: str
    title: str
    run_seed: Callable
    report: Callable[[list, object], str]
    data: Callable[[object, int], object] | None = None


@dataclasses.dataclass(frozen=True)
class PaperTables:
    """What a paper-table script runs: the report's title, the data of a seed
    (``data(settings, seed)``, built once and shared by the experiments that have none of
    their own; ``None`` when every experiment has its own) and the experiments in report
    order."""

    title: str
    data: Callable[[object, int], object] | None
    experiments: tuple[Experiment, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.experiments)


def add_experiment(parser, spec: PaperTables) -> None:
    """``--experiment NAME|all``: one of ``spec``'s experiments, or all (the default)."""
    parser.add_argument("--experiment", choices=(*spec.names, "all"), default="all")


def run_paper_tables(
    spec: PaperTables,
    settings,
    experiment: str | Sequence[str],
    command: str,
    quick: bool,
    out: Path | None,
    facts: str = "",
    intro: Callable[[dict[str, list]], str] | None = None,
    after: Callable[[dict[str, list]], Sequence[str]] | None = None,
    checkpoint: Callable[[dict[str, list]], None] | None = None,
    checkpoints=None,
) -> str:
    """Run ``spec``'s ``experiment`` (a name, several names, or ``"all"``; in ``spec``'s
    order) over ``settings.seeds``; print and return the report (written to ``out`` when
    given): :func:`report_header`, then ``facts`` (more header lines), then ``intro(results)``
    (a section before the experiments'), one section per experiment run, and the sections
    of ``after(results)`` (e.g. ones that read several experiments, or that draw figures).
    ``results`` maps each experiment run to its per-seed results; ``checkpoint(results)`` is
    called after each experiment with the results so far (e.g. to write files a later run
    resumes from). ``checkpoints`` (a :class:`benchmarks.checkpoints.Checkpoints`) keeps each
    finished seed of an experiment (key ``<experiment>-seed<seed>``) and reads it back in a
    later run under the same settings; a seed's data is then built only when it is computed."""
    wanted = {experiment} if isinstance(experiment, str) else set(experiment)
    chosen = [e for e in spec.experiments if wanted & {e.name, "all"}]
    started = time.perf_counter()
    shared = functools.cache(partial(spec.data, settings)) if spec.data is not None else None
    results: dict[str, list] = {}
    sections = []
    for e in chosen:
        print(e.title)
        seed_data = shared if e.data is None else partial(e.data, settings)

        def run(e=e, seed_data=seed_data, seed=0):
            return e.run_seed(seed_data(seed), settings, seed)

        if checkpoints is None:
            results[e.name] = [run(seed=s) for s in settings.seeds]
        else:
            results[e.name] = [
                checkpoints.get(f"{e.name}-seed{s}", partial(run, seed=s)) for s in settings.seeds
            ]
        sections.append(e.report(results[e.name], settings))
        if checkpoint is not None:
            checkpoint(results)
    first = [intro(results)] if intro is not None else []
    sections = [*first, *sections, *(after(results) if after is not None else [])]
    header = report_header(spec.title, command, quick, time.perf_counter() - started)
    header += f"\n{facts}" if facts else ""
    if checkpoints is not None and checkpoints.folder is not None:
        header += f"\n- {checkpoints.provenance()}"
    return emit_report("\n\n".join([header, *sections]) + "\n", out)


def with_options(params: dict) -> dict:
    """A flat settings table (as a report prints it) as the estimators take it: the keys that
    are fields of :class:`~fednovelty.Training` (``local_epochs``, ``learning_rate``,
    ``batch_size``, ...) or :class:`~fednovelty.Objective` (VGM2's loss weights) gathered
    into those option objects; the other keys as they are."""
    from fednovelty.detectors.options import Objective, Training

    out = dict(params)
    for name, cls in (("training", Training), ("objective", Objective)):
        fields = {k: out.pop(k) for k in cls().get_params() if k in out}
        if fields:
            out[name] = cls(**fields)
    return out
