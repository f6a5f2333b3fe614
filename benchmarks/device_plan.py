"""What ``benchmarks/device_checks.py`` plans with: a command's time budget, the checkpoint
folder's record of what earlier commands did, the stamp beside each figure, the line of
seconds against rounds, and the GPU window arithmetic.

A lent GPU machine runs one command for at most 10 minutes (:data:`COMMAND_LIMIT_S`) and a
session holds it for about 15 minutes in all (:data:`SESSION_DEVICE_S`), its start-up of 3-4
minutes (:data:`START_UP_S`) included: one command of :data:`DEFAULT_BUDGET_S` per session,
with room to spare for the copies. Long work therefore continues across commands from a
checkpoint folder (:class:`Progress`), and each command stops starting new work when the
next piece, estimated from measured ones (:class:`Cost`), would not end within its budget
(:class:`Budget`).

Not an installed module: ``benchmarks`` is the repository's package of scripts.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.checkpoints import git_commit, settings_signature

#: seconds one command may run on the lent machine, and the default budget under it.
COMMAND_LIMIT_S, DEFAULT_BUDGET_S = 600.0, 540.0
#: a session's device time, and a machine's start-up within it (low, high).
SESSION_DEVICE_S, START_UP_S = 900.0, (180.0, 240.0)
#: seconds a part keeps back for its last steps (accuracy, saving, the report).
RESERVE_S = 30.0
#: the FEMNIST paper's rounds and the GPU time they should take in all.
PAPER_ROUNDS, TARGET_S = 200, 600.0
#: one local epoch of 539 copies of FedGMM's FEMNIST CNN (one per writer, batches of 128) on
#: an H100/H200: batched with torch.func.vmap, and one copy at a time (seconds; measured
#: outside this repository's reports, quoted for the plan in docs/contributing.md).
GPU_EPOCH_539_CNNS_S = {"batched": 0.74, "one at a time": 12.4}


class Budget:
    """Seconds a command may use, counted from ``started`` (``time.perf_counter``);
    :meth:`share` narrows it to a deadline for one part of the command.

    Args:
        seconds: the command's budget.
        started: when it started; default now.
        deadline: a ``perf_counter`` time before the budget's end (a share).
    """

    def __init__(self, seconds: float, started: float | None = None, deadline=None) -> None:
        self.seconds = float(seconds)
        self.started = time.perf_counter() if started is None else started
        self.deadline = self.started + self.seconds if deadline is None else deadline

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        """Seconds until the deadline (negative once past it)."""
        return self.deadline - time.perf_counter()

    def fits(self, seconds: float) -> bool:
        """Whether work of ``seconds`` started now ends by the deadline."""
        return seconds <= self.left()

    def share(self, parts: int) -> Budget:
        """The same budget with the deadline at an equal share of what is left among
        ``parts`` parts (>= 1), this one first."""
        return Budget(self.seconds, self.started, time.perf_counter() + self.left() / parts)


@dataclass(frozen=True)
class Cost:
    """Seconds of a piece of work against its rounds: ``fixed + per_round * rounds``."""

    fixed: float
    per_round: float

    def seconds(self, rounds: int) -> float:
        return self.fixed + self.per_round * rounds

    def rounds_within(self, seconds: float) -> int:
        """The most rounds whose work ends within ``seconds`` (0 when none does)."""
        if self.per_round <= 0:
            return 0
        return max(0, math.floor((seconds - self.fixed) / self.per_round))


def fit_cost(points: list[tuple[int, float]]) -> Cost | None:
    """The cost line through measured ``(rounds, seconds)`` points: through the points of
    fewest and most rounds (the mean seconds at each), its slope at least 1 % of the larger
    one's seconds per round; a single round count gives all of its seconds per round (an
    upper bound, no fixed part). ``None`` without points."""
    if not points:
        return None
    by_rounds: dict[int, list[float]] = {}
    for rounds, seconds in points:
        by_rounds.setdefault(int(rounds), []).append(float(seconds))
    low, high = min(by_rounds), max(by_rounds)
    s_low = sum(by_rounds[low]) / len(by_rounds[low])
    s_high = sum(by_rounds[high]) / len(by_rounds[high])
    if low == high:
        return Cost(0.0, s_high / max(1, high))
    slope = max((s_high - s_low) / (high - low), 0.01 * s_high / high)
    return Cost(max(0.0, s_high - slope * high), slope)


def stamp(device: str, commit: str | None = None) -> dict:
    """What goes beside each figure: the device, today's date and the commit (``commit``, or
    this checkout's ``git rev-parse --short HEAD`` with ``+`` for uncommitted changes, or
    ``"unknown"`` where the copy has no git)."""
    return {
        "device": device,
        "date": datetime.date.today().isoformat(),
        "commit": commit or git_commit(),
    }


def stamp_text(record: dict) -> str:
    return f"{record['device']}, {record['date']}, commit {record['commit']}"


class Progress:
    """The checkpoint folder's ``progress.json``: one section (a dict) per part of the
    command, written whole and atomically (a torn write leaves the previous file).

    Args:
        folder: the checkpoint folder (made on the first write).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "progress.json"
        self.data: dict = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def section(self, name: str, signature: str) -> dict:
        """Part ``name``'s section when it was written under ``signature``; a fresh one
        otherwise (what another setting left is set aside as ``<name>.old``)."""
        found = self.data.get(name)
        if found is not None and found.get("signature") != signature:
            self.data[f"{name}.old"] = found
            found = None
        if found is None:
            found = self.data[name] = {"signature": signature}
        return found

    def write(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.data, indent=1, sort_keys=True, default=str))
        os.replace(partial, self.path)


# ----------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class RoundTimes:
    """Measured seconds that plan FedGMM's FEMNIST rounds across commands.

    Attributes:
        per_round: one joint round.
        chunk_overhead: what a chunk of rounds adds (scoring the rows, saving the model).
        chunk_rounds: rounds in a chunk.
        fixed: a command's start before its first round (data, warm-up, loading the model).
        first_fixed: the first command's, federated PCA's and the initialisation's rounds
            and the first joint round included.
        lane: the CUDA lane, in the first command.
    """

    per_round: float
    chunk_overhead: float = 0.0
    chunk_rounds: int = 10
    fixed: float = 60.0
    first_fixed: float = 90.0
    lane: float = 180.0

    @property
    def effective(self) -> float:
        """Seconds a round costs in a command, its share of the chunk's overhead included."""
        return self.per_round + self.chunk_overhead / max(1, self.chunk_rounds)


def commands_for(
    times: RoundTimes, rounds: int, done: int, budget: float, reserve: float = RESERVE_S
) -> tuple[int, int]:
    """``(rounds of the next command, commands to reach rounds)`` from ``done`` rounds, each
    command within ``budget`` seconds less the ``reserve`` kept for its end (the first, at
    ``done == 0``, runs the lane too). ``(0, 0)`` when done; a command that fits no round
    gives ``(0, -1)``."""
    if done >= rounds:
        return 0, 0
    per, usable = times.effective, budget - reserve
    later = max(0, math.floor((usable - times.fixed) / per))
    if done == 0:
        first = 1 + max(0, math.floor((usable - times.lane - times.first_fixed) / per))
        first = min(first, rounds)
    else:
        first = min(later, rounds - done)
    if first <= 0 or (done + first < rounds and later <= 0):
        return 0, -1
    rest = rounds - done - first
    return first, 1 + (math.ceil(rest / later) if rest > 0 else 0)


def plan_lines(
    times: RoundTimes,
    *,
    rounds: int = PAPER_ROUNDS,
    done: int = 0,
    budget: float = DEFAULT_BUDGET_S,
    source: str = "",
) -> list[str]:
    """The GPU window plan for ``rounds`` joint rounds from ``done``, as markdown lines:
    rounds per command, commands and sessions needed, device time, and the rounds' own
    GPU time against :data:`TARGET_S`."""
    per, low, high = times.effective, *START_UP_S
    first, commands = commands_for(times, rounds, done, budget)
    lines = [
        f"GPU window plan{f' ({source})' if source else ''}: {times.per_round:.2f} s a joint "
        f"round + {times.chunk_overhead:.1f} s per chunk of {times.chunk_rounds} rounds = "
        f"{per:.2f} s a round in a command; a command's start {times.fixed:.0f} s "
        f"(the first's {times.first_fixed:.0f} s, lane {times.lane:.0f} s before it).",
        f"- a command: budget {budget:.0f} s under the {COMMAND_LIMIT_S:.0f} s limit, "
        f"{RESERVE_S:.0f} s of it kept for the end (accuracy, saving, the report); the "
        f"machine's start-up {low / 60:.0f}-{high / 60:.0f} min comes first, so a "
        f"{SESSION_DEVICE_S / 60:.0f}-minute session holds one command.",
    ]
    if commands == 0:
        return [*lines, f"- all {rounds} rounds are done: no command needed."]
    if commands < 0:
        return [*lines, f"- a command of {budget:.0f} s fits no round: no plan reaches {rounds}."]
    usable = budget - RESERVE_S
    later = math.floor((usable - times.fixed) / per)
    if done == 0:
        used = times.lane + times.first_fixed + per * (first - 1)
        lines.append(
            f"- first command: lane {times.lane:.0f} s + start {times.first_fixed:.0f} s "
            f"(1 round in it) + {first - 1} rounds x {per:.2f} s = {used:.0f} s: rounds 1-{first}."
        )
    else:
        lines.append(
            f"- next command: start {times.fixed:.0f} s + {first} rounds x {per:.2f} s = "
            f"{times.fixed + first * per:.0f} s: rounds {done + 1}-{done + first}."
        )
    rest = rounds - done - first
    if rest > 0:
        lines.append(
            f"- later commands: ({budget:.0f} - {RESERVE_S:.0f} - {times.fixed:.0f}) / {per:.2f} = "
            f"{later} rounds "
            f"each; {rest} rounds left: {commands - 1} more."
        )
    gpu = times.first_fixed + per * (rounds - 1) + times.fixed * (commands - 1)
    verdict = "within" if gpu <= TARGET_S else "over"
    lines += [
        f"- commands (one per session): {commands}; device time about {commands} x "
        f"({low:.0f}-{high:.0f} s start-up + the command) = "
        f"{commands * low / 60 + (gpu + times.lane) / 60:.0f}-"
        f"{commands * high / 60 + (gpu + times.lane) / 60:.0f} min.",
        f"- {rounds} rounds' GPU time: {times.first_fixed:.0f} + {rounds - 1} x {per:.2f} + "
        f"{commands - 1} x {times.fixed:.0f} = {gpu:.0f} s = {gpu / 60:.1f} min: {verdict} the "
        f"{TARGET_S / 60:.0f}-minute target ({TARGET_S / rounds:.0f} s a round).",
    ]
    return lines


# ----------------------------------------------------------------------------- script parts


@dataclass(frozen=True)
class ScriptPlan:
    """A paper-table script run one unit (one setting and seed) per call of its ``main``.

    Attributes:
        name: the part; module: ``benchmarks.<module>``; rounds_flag: its rounds option.
        rounds: the paper's rounds; probes: the rounds of the timing calls.
        units: ``(name, arguments)`` per call, the rounds, device and output left out.
        output: ``folder -> arguments`` naming where a call writes.
        read: ``(folder, the returned report) -> what is kept`` of a finished call.
    """

    name: str
    module: str
    rounds_flag: str
    rounds: int
    probes: tuple[int, ...]
    units: tuple[tuple[str, tuple[str, ...]], ...]
    output: Callable[[Path], list[str]]
    read: Callable[[Path, str], object]


def fedcam_plan(quick: bool) -> ScriptPlan:
    """``fedcam_table1.py``'s Table 1 at its paper scale (MNIST, the cluster-wise partitions,
    K = 5 and 10, seeds 0 1 2, FedAvg+ on seed 0; 100 rounds), or ``quick``'s one small call
    (3 rounds)."""
    from benchmarks.fedcam_table1 import SCALES

    if quick:
        scale = ["--clients", "10", "--rows", "1000", "--learner", "mlp"]
        scale += ["--methods", "FedAvg", "IFCA-CAM"]
        rounds, grid = 3, [(0, "cluster-dir", 2)]
    else:
        scale, rounds = ["--paper-scale"], SCALES["paper"]["rounds"]
        partitions = ("cluster-dir", "cluster-nclass")
        grid = [(s, p, k) for s in (0, 1, 2) for p in partitions for k in (5, 10)]

    def unit(seed: int, partition: str, k: int) -> tuple[str, tuple[str, ...]]:
        grid_flags = ("--datasets", "mnist", "--partitions", partition, "--ks", str(k))
        # FedAvg+ (K FedAvg models) on the first seed only, as the script's default
        seed_flags = ("--seeds", str(seed), "--plus-seeds", *([str(seed)] if seed == 0 else []))
        return f"mnist {partition} K={k} seed {seed}", (*scale, *grid_flags, *seed_flags)

    units = tuple(unit(*cell) for cell in grid)

    def read(folder: Path, _report: str) -> list[dict]:
        records = json.loads((folder / "fedcam_table1.json").read_text())
        return [{k: v for k, v in r.items() if k not in ("sizes", "clusters")} for r in records]

    probes = (1, 2) if quick else (1, 3)
    output = lambda folder: ["--out-dir", str(folder)]  # noqa: E731
    return ScriptPlan("fedcam", "fedcam_table1", "--rounds", rounds, probes, units, output, read)


def pfedem_plan(quick: bool) -> ScriptPlan:
    """``pfedem_femnist.py``'s Table I at its paper scale with the paper's Gaussians on the
    backbone's features (3 cycles, linear and cosine, 200 windows, seeds 0 1 2), or
    ``quick``'s one small call (4 writers, 1 cycle, 3 windows)."""
    from benchmarks.pfedem_femnist import SCALES

    if quick:
        scale, rounds, seeds, cycles = ["--writers", "4"], 3, (0,), "1"
    else:
        scale = ["--paper-scale", "--gaussian-features", "backbone"]  # the paper's Gaussians
        rounds, seeds, cycles = SCALES["paper"][1], (0, 1, 2), "3"
    units = tuple(
        (f"{cycles} cycles seed {s}", (*scale, "--cycles", cycles, "--seeds", str(s)))
        for s in seeds
    )
    probes = (1, 2) if quick else (1, 3)
    output = lambda folder: ["--out", str(folder / "pfedem.md")]  # noqa: E731
    read = lambda _folder, report: report  # noqa: E731
    return ScriptPlan("pfedem", "pfedem_femnist", "--windows", rounds, probes, units, output, read)


def call_script(plan: ScriptPlan, unit: tuple[str, ...], rounds: int, device: str, log: Path):
    """One call of the script's ``main`` at ``rounds``, its output appended to ``log``:
    ``(seconds, what is kept)``."""
    module = importlib.import_module(f"benchmarks.{plan.module}")
    with tempfile.TemporaryDirectory() as folder:
        argv = [*unit, plan.rounds_flag, str(rounds), "--device", device]
        started = time.perf_counter()
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as fh, contextlib.redirect_stdout(fh), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            print(f"\n### python -m benchmarks.{plan.module} {' '.join(argv)}", flush=True)
            report = module.main([*argv, *plan.output(Path(folder))])
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started, plan.read(Path(folder), report)


def script_part(plan: ScriptPlan, args, budget: Budget, progress: Progress, facts: dict):
    """The part's calls within ``budget``: probes until the cost line is known, then each
    unit not yet done at the paper's rounds while one fits (a unit that fits no whole command
    of ``args.budget_s`` runs once at the rounds that fit, kept apart as a timing); returns
    the report lines."""
    signature = settings_signature({"units": plan.units, "rounds": plan.rounds})
    section = progress.section(plan.name, signature)
    points = section.setdefault("points", {}).setdefault(facts["device"], [])
    done, capped = section.setdefault("units", {}), section.setdefault("capped", {})
    log, stopped = progress.folder / "scripts.log", ""

    def call(unit, rounds: int) -> dict:
        seconds, kept = call_script(plan, unit, rounds, args.device, log)
        points.append([rounds, seconds])
        print(f"  {plan.name}, {rounds} {plan.rounds_flag[2:]}: {seconds:.1f} s", flush=True)
        return {**facts, "rounds": rounds, "seconds": seconds, "kept": kept}

    for rounds in plan.probes:
        if len({r for r, _ in points}) >= 2:
            break
        cost = fit_cost(points)
        need = cost.seconds(rounds) if cost else 0.0
        if budget.left() < RESERVE_S or not budget.fits(need + RESERVE_S):
            stopped = f"budget: {budget.left():.0f} s left, not enough for a timing call"
            break
        call(plan.units[0][1], rounds)
        progress.write()
    cost = fit_cost(points)
    for name, unit in plan.units if not stopped else ():
        if name in done:
            continue
        need = cost.seconds(plan.rounds)
        if budget.fits(need + RESERVE_S):
            done[name] = call(unit, plan.rounds)
            progress.write()
            cost = fit_cost(points)
            continue
        too_long = f"a call at {plan.rounds} needs {need:.0f} s, more than a command's "
        too_long += f"{args.budget_s:.0f} s"
        if need + RESERVE_S <= args.budget_s:
            stopped = f"budget: the next call ({name}) needs {need:.0f} s, "
            stopped += f"{budget.left():.0f} s left; the next command continues"
        elif name in capped:
            stopped = f"{too_long}: not run (its capped timing is kept)"
        else:
            rounds = cost.rounds_within(budget.left() - RESERVE_S)
            stopped = f"{too_long}: no time left for a capped timing"
            if rounds >= 1:
                capped[name] = call(unit, rounds)
                progress.write()
                cost = fit_cost(points)
                stopped = f"{too_long}: ran once at {rounds} for the timing"
        break
    else:
        stopped = stopped or f"all {len(plan.units)} calls done"
    progress.write()
    return script_report(plan, section, cost, stopped, args.budget_s)


def script_report(plan: ScriptPlan, section: dict, cost, stopped: str, budget_s: float):
    """The part's report lines: why it stopped, the cost line, the projection to the whole
    table, and every call kept with its device, date and commit."""
    title = {
        "fedcam": "Fed-CAM Table 1 (fedcam_table1.py)",
        "pfedem": "pFedEM Table I (pfedem_femnist.py)",
    }[plan.name]
    unit_of = plan.rounds_flag[2:]  # rounds, windows
    done = section["units"]
    lines = [f"## {title} at the paper's scale", "", f"- stopped: {stopped}"]
    if cost is not None:
        full = cost.seconds(plan.rounds)
        per_command = int((budget_s - RESERVE_S) // full) if full > 0 else 0
        left = len(plan.units) - len(done)
        more = f"{-(-left // per_command)} more command(s)" if per_command else "no command"
        lines += [
            f"- seconds per call: {cost.fixed:.1f} + {cost.per_round:.2f} per {unit_of[:-1]} "
            "(every method of the call)",
            f"- projection: a call at the paper's {plan.rounds} {unit_of} = {full:.0f} s; "
            f"{len(done)} of {len(plan.units)} calls done; {per_command} call(s) fit a "
            f"{budget_s:.0f} s command: {more} for the rest ({left} x {full:.0f} s = "
            f"{left * full / 60:.1f} min)",
        ]
    lines += ["", f"| call | {unit_of} | s | device, date, commit |", "|---|---|---|---|"]
    for kind, records in (("", done), (" (capped: a timing)", section["capped"])):
        for name, r in records.items():
            lines.append(f"| {name}{kind} | {r['rounds']} | {r['seconds']:.1f} | {stamp_text(r)} |")
    return lines


__all__ = [
    "COMMAND_LIMIT_S",
    "DEFAULT_BUDGET_S",
    "GPU_EPOCH_539_CNNS_S",
    "PAPER_ROUNDS",
    "RESERVE_S",
    "SESSION_DEVICE_S",
    "START_UP_S",
    "TARGET_S",
    "Budget",
    "Cost",
    "Progress",
    "RoundTimes",
    "ScriptPlan",
    "call_script",
    "commands_for",
    "fedcam_plan",
    "fit_cost",
    "pfedem_plan",
    "plan_lines",
    "script_part",
    "script_report",
    "stamp",
    "stamp_text",
]
