"""The checks to run on a lent GPU machine, each command within one 10-minute run.

Parts (``--part``, in this order; default ``lane femnist``; ``all`` is the four):

1. ``lane``: the CUDA lane (``pytest -m cuda tests/detectors/test_cuda_lane.py``): every
   registry method fitted on CUDA scores as on the CPU; its counts and time, stopped after
   ``--lane-timeout`` seconds or its share of the budget (skipped with ``--quick``).
2. ``femnist``: FedGMM at the FEMNIST paper's scale (``fedgmm_femnist.py``'s ``PAPER_SCALE``:
   539 writers, the paper's CNN, M1 = M2 = 3, SGD in batches of 128, one local epoch) at
   ``--femnist-lr`` (default 10**-1.5, :data:`FEMNIST_LR`), the clients batched (every writer's
   learners one ``torch.func.vmap``'d computation, the E-steps one batch), towards
   ``--target-rounds`` (200) joint rounds across commands: a fit of one joint round, then
   ``partial_fit`` chunks of ``--chunk-rounds``, the detector saved to ``--checkpoint`` after
   each chunk, so the next command continues from the last completed round. Seconds per joint
   round (the fit's round records), per chunk (scoring and saving), a command's start, the test
   accuracy (each writer's own weights) after the rounds done, and the window plan to 200 rounds
   (``benchmarks/device_plan.py``).
3. ``fedcam``: ``fedcam_table1.py`` at its paper scale (``--paper-scale``: 200 clients, 100
   rounds, the CNN), Table 1's settings (MNIST, the two cluster-wise partitions, K = 5 and
   10, seeds 0 1 2) one setting and seed per call.
4. ``pfedem``: ``pfedem_femnist.py`` at its paper scale (80 writers, 200 windows, the CNN),
   Table I (3 cycles, linear and cosine), one seed per call.

The budget (``--budget-s``, default 540 s under the 600 s a command may run) is shared
equally among the parts still to run; a part stops starting work when the next piece,
estimated from the ones measured (rounds of this command, or the checkpoint's record of the
same device), would not end within its share (:class:`benchmarks.device_plan.Budget`). A
FedGMM run with no checkpoint always runs its first round, which every estimate needs. For
``fedcam`` and ``pfedem`` two short probes (1 and 3 rounds or windows) give the line of
seconds against rounds; a call at the paper's rounds runs when it fits, one that fits no
whole command runs once at the rounds that fit (a timing, kept apart). Finished calls are
kept in the checkpoint's ``progress.json`` and never run again. Every figure is stamped with
the device, the date and the commit (``--commit``, default this checkout's).

``--quick`` runs the same code on a CPU in seconds (8 writers, the MLP, 4 rounds; small
``fedcam`` and ``pfedem`` calls) into a temporary checkpoint unless ``--checkpoint`` is given.
``--plan S`` prints the window plan for S seconds a joint round and exits. The command for
the lent machine, and the arithmetic, are in ``docs/contributing.md`` (The CUDA lane).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from benchmarks.checkpoints import settings_signature
from benchmarks.common import (
    REPO,
    RESULTS,
    add_out,
    add_quick,
    command_line,
    device_facts,
    emit_report,
    personal_accuracy,
    report_header,
    shifted_writers,
    standardised,
)
from benchmarks.device_plan import (
    DEFAULT_BUDGET_S,
    PAPER_ROUNDS,
    RESERVE_S,
    Budget,
    Progress,
    RoundTimes,
    commands_for,
    fedcam_plan,
    pfedem_plan,
    plan_lines,
    script_part,
    stamp,
    stamp_text,
)
from benchmarks.fedgmm_femnist import PAPER_SCALE, Settings, make_model
from fednovelty.detectors.joint_fedgmm import JointFedGMMDetector

PARTS = ("lane", "femnist", "fedcam", "pfedem")
MODEL_PREFIX = "femnist_fedgmm"
#: the largest file a lent machine's ``$OUT`` hands back.
LARGEST_RETURNED = 16 * 2**20


# ----------------------------------------------------------------------------- 1. lane
def cuda_lane(timeout_s: float, log: Path | None = None) -> str:
    """The lane's summary line (``N passed, M skipped in T s``) and its failures, or why it did
    not finish. ``log``: where pytest's whole output goes (each failure's traceback and the
    mismatches it found), so that a failure on the lent machine can be read afterwards."""
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    command += ["-rf", "--tb=short", str(REPO / "tests" / "detectors" / "test_cuda_lane.py")]
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as stopped:
        done = None
        output = (stopped.stdout or b"").decode() if isinstance(stopped.stdout, bytes) else ""
    else:
        output = done.stdout + done.stderr
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(output)
    if done is None:
        return f"did not finish within {timeout_s:.0f} s"
    lines = [
        line for line in done.stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped)", line)
    ]
    failed = [line[:300] for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return "; ".join([*(lines[-1:] or [f"exit {done.returncode}"]), *failed])


def lane_part(args, budget: Budget, facts: dict) -> tuple[list[str], float]:
    """The lane's report line and its seconds."""
    if args.quick:
        return ["## CUDA lane", "", "- skipped (--quick)"], 0.0
    timeout = min(args.lane_timeout, budget.left())
    started = time.perf_counter()
    log = Path(args.checkpoint) / "lane.log" if args.checkpoint else None
    line = cuda_lane(timeout, log) if timeout > 0 else "not run: no budget left"
    seconds = time.perf_counter() - started
    print(f"CUDA lane: {line} ({seconds:.0f} s)", flush=True)
    return ["## CUDA lane", "", f"- {line}; {seconds:.0f} s ({stamp_text(facts)})"], seconds


# ----------------------------------------------------------------------------- 2. femnist
#: FedGMM's learning rate for the FEMNIST part: 10**-1.5, from the paper's grid (App. C.1:
#: 10**-0.5 ... 10**-3). At the paper's stated 0.001 (one epoch of a writer's ~134 training
#: rows, two batches a round) the CNN stays under-trained: 6.2 % test accuracy after 49 rounds
#: on the H200 (539 writers); on a CPU probe of 10 writers (``docs/papers/fedgmm.md``) 12.7 %
#: training accuracy after 200 rounds, against 77.1 % at 10**-1.5.
FEMNIST_LR = 10**-1.5


def femnist_settings(args) -> Settings:
    """The run's scale with ``max_iter=1`` (the first fit): ``PAPER_SCALE`` or, ``--quick``,
    8 writers with the CPU scale's MLP."""
    if args.quick:
        return Settings(8, 1, (0,), device=args.device)
    rate = {"learning_rate": args.femnist_lr} if args.femnist_lr is not None else {}
    return Settings(seeds=(0,), device=args.device, **{**PAPER_SCALE, "max_iter": 1, **rate})


def continue_rounds(model: JointFedGMMDetector, data, rounds: int) -> JointFedGMMDetector:
    """``rounds`` more joint rounds of ``model`` on ``data``'s training rows
    (``partial_fit``, which starts its algorithm from the fitted precisions)."""
    return model.partial_fit(data.X_train, data.y_train, data.groups_train, rounds=rounds)


def synchronised(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def write_profile(profiler: cProfile.Profile, path: Path, rounds: int) -> None:
    """The profile of ``rounds`` joint rounds, the 40 functions of most own time and of most
    cumulative time, to ``path`` (it comes back through ``$OUT`` with the checkpoint)."""
    out = io.StringIO()
    out.write(f"cProfile of {rounds} joint round(s) (the command's first chunk)\n")
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.getvalue())


def joint_seconds(model) -> list[float]:
    """Seconds of each joint EM round of the model's last fit or ``partial_fit``."""
    return [r["seconds"] for r in model.history_ if r["kind"] == "joint_em"]


def save_model(model, folder: Path, section: dict, done: int, progress: Progress) -> None:
    """Save the model after ``done`` rounds, point the progress record at it, then drop the
    previous file (a command killed in between leaves a consistent pair)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{MODEL_PREFIX}.r{done:03d}.safetensors"
    model.save(folder / name)
    previous = section.get("model")
    section.update(model=name, done=done)
    progress.write()
    if previous and previous != name:
        (folder / previous).unlink(missing_ok=True)


class FemnistRun:
    """One command's FedGMM rounds: the model, the rounds done, this command's timings."""

    def __init__(self, args, budget: Budget, progress: Progress, facts: dict) -> None:
        self.args, self.budget, self.progress, self.facts = args, budget, progress, facts
        self.settings = femnist_settings(args)
        signature = settings_signature(dataclasses.replace(self.settings, max_iter=0))
        self.section = progress.section("femnist", signature)
        self.folder = progress.folder
        self.rounds: list[float] = []  # this command's joint rounds after the first fit
        self.first_round: float | None = None  # the first fit's joint round (first use)
        self.overheads: list[float] = []  # per chunk: scoring and saving
        self.first_fit = None  # seconds of the first fit, in the command that ran it
        self.stopped = ""

    def estimate(self) -> tuple[float, float] | None:
        """Seconds of a joint round and of a chunk's overhead: this command's, else the
        checkpoint's last command on the same device."""
        overhead = max(self.overheads) if self.overheads else 0.0
        if self.rounds:
            return sum(self.rounds) / len(self.rounds), overhead
        if self.first_round is not None:
            return self.first_round, overhead
        for record in reversed(self.section.get("commands", [])):
            if record["device"] == self.facts["device"] and record.get("per_round"):
                return record["per_round"], record.get("chunk_overhead", 0.0)
        return None

    def start(self, data):
        """The model to continue and its rounds: the checkpoint's, or a new fit of one joint
        round (no checkpoint, or its model file is missing)."""
        done = int(self.section.get("done", 0))
        if done and (self.folder / self.section["model"]).is_file():
            return JointFedGMMDetector.load(self.folder / self.section["model"]), done
        if done:
            print(f"  {self.section['model']} is missing: FedGMM starts again", flush=True)
        model = make_model("FedGMM", self.settings, seed=0)
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one round does not converge: expected
            model.fit(data.X_train, data.y_train, data.groups_train)
        synchronised(self.settings.device)
        self.first_fit = time.perf_counter() - started
        self.first_round = sum(joint_seconds(model))
        save_model(model, self.folder, self.section, 1, self.progress)
        return model, 1

    def next_chunk(self, done: int, this_command: int) -> int:
        """Rounds of the next chunk (0: stop, the reason in ``stopped``)."""
        args = self.args
        if done >= args.target_rounds:
            self.stopped = f"target reached: {done} of {args.target_rounds} rounds"
            return 0
        if args.max_rounds is not None and this_command >= args.max_rounds:
            self.stopped = f"--max-rounds {args.max_rounds} rounds run in this command"
            return 0
        wanted = min(args.chunk_rounds, args.target_rounds - done)
        if args.max_rounds is not None:
            wanted = min(wanted, args.max_rounds - this_command)
        estimate = self.estimate()
        if estimate is None:
            return 1  # no measurement on this device yet: one round measures it
        per_round, overhead = estimate
        left = self.budget.left() - RESERVE_S - overhead
        fits = int(left // per_round) if per_round > 0 else wanted
        if fits < 1:
            self.stopped = (
                f"budget: the next round ({per_round:.2f} s, {overhead:.2f} s per chunk, "
                f"{RESERVE_S:.0f} s kept for the end) would end after the budget "
                f"({self.budget.left():.0f} s left); the next command continues from round {done}"
            )
            return 0
        return min(wanted, fits)

    def run(self) -> list[str]:
        started = time.perf_counter()
        settings = self.settings
        data = standardised(shifted_writers(settings.n_writers, 0))
        warm = dataclasses.replace(settings, n_writers=8)  # imports, the kernels' first use
        warm_data = standardised(shifted_writers(8, 0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warm_model = make_model("FedGMM", warm, 0)
            warm_model.fit(warm_data.X_train, warm_data.y_train, warm_data.groups_train)
        model, done = self.start(data)
        first_done = 0 if self.first_fit is not None else done
        setup = time.perf_counter() - started - (self.first_fit or 0.0)
        print(f"FedGMM FEMNIST: from round {first_done}, {done} done after the start", flush=True)
        while chunk := self.next_chunk(done, done - first_done):
            began = time.perf_counter()
            profiler = cProfile.Profile() if self.args.profile and not self.overheads else None
            if profiler is not None:  # the command's first chunk: where a round's time goes
                profiler.enable()
            continue_rounds(model, data, chunk)
            synchronised(settings.device)
            if profiler is not None:
                profiler.disable()
                write_profile(profiler, self.folder / "round_profile.txt", chunk)
            save_model(model, self.folder, self.section, done + chunk, self.progress)
            seconds = joint_seconds(model)
            self.rounds += seconds
            self.overheads.append(time.perf_counter() - began - sum(seconds))
            done += chunk
            print(
                f"  rounds {done - chunk + 1}-{done}: {sum(seconds) / chunk:.2f} s a round, "
                f"{self.overheads[-1]:.1f} s scoring and saving",
                flush=True,
            )
        began = time.perf_counter()
        accuracy = personal_accuracy(model, data.X_test, data.y_test, data.groups_test)
        evaluation = time.perf_counter() - began
        record = {
            **self.facts,
            "first_round": first_done + 1,
            "last_round": done,
            "rounds": done - first_done,
            "per_round": self.estimate()[0] if self.estimate() else None,
            "chunk_overhead": max(self.overheads) if self.overheads else 0.0,
            "setup": setup,
            "first_fit": self.first_fit,
            "accuracy": accuracy,
            "evaluation": evaluation,
            "wall": time.perf_counter() - started,
        }
        if record["rounds"] > 0 or not self.section.get("commands"):
            self.section.setdefault("commands", []).append(record)
        self.progress.write()
        return self.report(record, done)

    def round_times(self, record: dict, lane_s: float) -> RoundTimes:
        """The plan's inputs: this command's measurements, the first command's start."""
        commands = self.section.get("commands", [])
        first = next((c for c in commands if c.get("first_fit")), None)
        setup = record["setup"]
        return RoundTimes(
            per_round=record["per_round"] or 0.0,
            chunk_overhead=record["chunk_overhead"],
            chunk_rounds=self.args.chunk_rounds,
            fixed=setup + record["evaluation"],
            first_fixed=(first["setup"] + first["first_fit"]) if first else setup,
            lane=lane_s,
        )

    def report(self, record: dict, done: int) -> list[str]:
        args = self.args
        scale = dataclasses.replace(self.settings, max_iter=args.target_rounds)
        path = self.folder / self.section["model"]
        size = path.stat().st_size
        lines = [
            "## FedGMM, FEMNIST at the paper's scale" + (" (quick: 8 writers, MLP)" * args.quick),
            "",
            f"- scale: {scale.describe()}",
            f"- checkpoint: {path} ({size / 1e6:.1f} MB"
            + (", over the 16 MiB a lent machine returns)" if size > LARGEST_RETURNED else ")"),
            f"- this command ({stamp_text(record)}): rounds {record['first_round']}-"
            f"{record['last_round']} ({record['rounds']} round(s)) in {record['wall']:.1f} s; "
            + (f"{record['per_round']:.2f} s per joint round, " if record["per_round"] else "")
            + f"{record['chunk_overhead']:.2f} s per chunk of up to {args.chunk_rounds} rounds, "
            f"start {record['setup']:.1f} s"
            + (f", first fit {record['first_fit']:.1f} s" if record["first_fit"] else ""),
            f"- test accuracy after {done} round(s): {record['accuracy']:.2f} % "
            f"(each writer's own weights; {record['evaluation']:.1f} s)",
            f"- stopped: {self.stopped}",
            "",
            "| command | device, date, commit | rounds | s per joint round | s per chunk | "
            "start s | accuracy % |",
            "|---|---|---|---|---|---|---|",
        ]
        for i, c in enumerate(self.section.get("commands", []), 1):
            per = f"{c['per_round']:.2f}" if c.get("per_round") else "-"
            lines.append(
                f"| {i} | {stamp_text(c)} | {c['first_round']}-{c['last_round']} | {per} | "
                f"{c['chunk_overhead']:.2f} | {c['setup']:.1f} | {c['accuracy']:.2f} |"
            )
        return lines


def femnist_plan(run: FemnistRun, lane_s: float) -> list[str]:
    """The plan from this command's measurements: 200 rounds from scratch, then from here."""
    record = run.section["commands"][-1]
    if not record.get("per_round"):
        return []
    times = run.round_times(record, lane_s)
    target, done = run.args.target_rounds, run.section["done"]
    budget = run.args.budget_s
    lines = plan_lines(times, rounds=PAPER_ROUNDS, budget=budget, source=stamp_text(record))
    first, commands = commands_for(times, target, done, budget)
    if 0 < done < target and commands > 0:
        lines.append(
            f"- from round {done}: the next command runs {first} rounds; {commands} "
            f"command(s) to {target}."
        )
    return ["", *lines]


# ----------------------------------------------------------------------------- command line
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--part", nargs="+", choices=(*PARTS, "all"), default=["lane", "femnist"])
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    parser.add_argument("--lane-timeout", type=float, default=240.0)
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="default: benchmarks/results/device"
    )
    parser.add_argument("--target-rounds", type=int, default=None, help="default 200 (quick 4)")
    parser.add_argument("--chunk-rounds", type=int, default=None, help="default 10 (quick 1)")
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false",
        help="do not profile the first chunk (round_profile.txt in the checkpoint folder)",
    )  # fmt: skip
    parser.add_argument("--max-rounds", type=int, default=None, help="FedGMM rounds this command")
    parser.add_argument(
        "--femnist-lr",
        type=float,
        default=FEMNIST_LR,
        help=f"FedGMM's SGD learning rate (default {FEMNIST_LR:.4f} = 10**-1.5, a value of the "
        "paper's grid; the paper's stated 0.001 leaves the CNN under-trained in 200 rounds)",
    )
    parser.add_argument("--commit", default=None, help="default: git rev-parse --short HEAD")
    parser.add_argument(
        "--plan", type=float, default=None, metavar="S", help="the plan for S s a round, only"
    )
    parser.add_argument("--plan-start", type=float, default=60.0, help="a command's start, s")
    parser.add_argument("--plan-lane", type=float, default=180.0, help="the lane's seconds")
    parser.add_argument("--plan-chunk", type=float, default=2.0, help="seconds a chunk adds")
    add_quick(parser)
    add_out(parser)
    args = parser.parse_args(argv)
    args.part = list(PARTS) if "all" in args.part else [p for p in PARTS if p in args.part]
    args.target_rounds = args.target_rounds or (4 if args.quick else PAPER_ROUNDS)
    args.chunk_rounds = args.chunk_rounds or (1 if args.quick else 10)
    if args.checkpoint is None:
        quick = Path(tempfile.mkdtemp(prefix="device_checks_")) if args.quick else None
        args.checkpoint = quick or RESULTS / "device"
    return args


def main(argv=None) -> str:
    args = parse_args(argv)
    if args.plan is not None:
        times = RoundTimes(
            args.plan,
            chunk_overhead=args.plan_chunk,
            chunk_rounds=args.chunk_rounds,
            fixed=args.plan_start,
            first_fixed=args.plan_start + 30,
            lane=args.plan_lane,
        )
        text = "\n".join(plan_lines(times, rounds=args.target_rounds, budget=args.budget_s))
        print(text)
        return text
    budget = Budget(args.budget_s)
    facts = stamp(device_facts(args.device), args.commit)
    progress = Progress(args.checkpoint)
    sections, lane_s, femnist = [], 0.0, None
    for i, part in enumerate(args.part):
        share = budget.share(len(args.part) - i)
        if part == "lane":
            lines, lane_s = lane_part(args, share, facts)
        elif part == "femnist":
            femnist = FemnistRun(args, share, progress, facts)
            lines = femnist.run()
        else:
            plan = (fedcam_plan if part == "fedcam" else pfedem_plan)(args.quick)
            lines = script_part(plan, args, share, progress, facts)
        sections += [*lines, ""]
        print("\n".join(lines), flush=True)
    if femnist is not None:
        sections += femnist_plan(femnist, lane_s if lane_s > 0 else args.plan_lane)
    header = report_header(
        "Device checks: the CUDA lane and the papers' scale on a GPU",
        command_line("device_checks", argv),
        args.quick,
        budget.elapsed(),
    )
    body = [
        header,
        f"- device: {stamp_text(facts)}; budget {args.budget_s:.0f} s, used "
        f"{budget.elapsed():.0f} s; checkpoint {args.checkpoint}",
        "",
        *sections,
    ]
    return emit_report("\n".join(body) + "\n", args.out)


if __name__ == "__main__":
    main()
