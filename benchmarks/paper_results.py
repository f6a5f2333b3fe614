"""The papers' tables in one format: ``benchmarks/results/papers/<paper>-<table>.md``.

Each file is one table of one paper as a script measured it, written by the script itself
(:func:`write`) from its results, never by hand:

- first line ``scale: paper`` or ``scale: reduced (<what differs from the paper's scale>)``;
- a title, then facts: the paper and table, the command, the algorithm (the paper's switches or
  the library's defaults, both when both ran), the settings that differ from the paper's with
  the paper's beside them, seeds, device, date and commit;
- the table: one row per method or score, the paper's number beside ours in every row;
- the verdict: what reproduced and what did not, with the diagnosis where not.

The pages under ``docs/papers/`` include these files between ``<!-- paper-table: NAME -->`` and
``<!-- /paper-table -->`` markers. ``python -m benchmarks.paper_results --build`` rebuilds every
file from the runs' kept results (:data:`BUILDERS`: each paper's module reads its runs'
checkpoints or cells) and copies them into the pages; ``--docs`` only copies; ``--check`` (run
by the test suite) fails where a file breaks the format or a page's block differs from its
file.

Not an installed module: ``benchmarks`` is the repository's package of scripts.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.checkpoints import REPO, git_commit

PAPERS = REPO / "benchmarks" / "results" / "papers"
DOCS = REPO / "docs" / "papers"
SCALE_LINE = re.compile(r"^scale: (paper|reduced \(.+\))$")
FACTS = ("paper", "command", "algorithm", "differs", "seeds", "device", "date", "commit")
_BLOCK = re.compile(
    r"(<!-- paper-table: (?P<name>[a-z0-9_.-]+) -->\n)(?P<body>.*?)(<!-- /paper-table -->)",
    re.DOTALL,
)
#: the modules whose ``tables()`` build the files from the runs' kept results.
BUILDERS = (
    "benchmarks.papers_fedgmm",
    "benchmarks.papers_fedgengmm",
    "benchmarks.papers_vgm2",
    "benchmarks.papers_pfedem",
)
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9_.]+)+$")


@dataclasses.dataclass(frozen=True)
class PaperTable:
    """One paper table as measured.

    Attributes:
        name: the file's stem, ``<paper>-<table>[-<variant>]`` in lower case
            (``fedgmm-t4-paper-protocol``).
        title: one line, e.g. ``"FedGMM Table 4: novel MNIST samples (App. C.3 protocol)"``.
        scale: ``"paper"`` or ``"reduced (<what differs>)"``.
        paper: which paper and table (``"FedGMM (000), Table 4"``).
        command: the command that ran.
        algorithm: what each "ours" column ran (the paper's switches, the defaults).
        differs: settings that differ from the paper's, each with the paper's beside it
            (``"none"`` when none does).
        seeds: the seeds.
        device: where it ran (``"cpu (2 cores ...)"``, ``"cuda (NVIDIA H200)"``).
        header: the table's columns; the second is the paper's number.
        rows: one list per row, as wide as ``header``.
        verdict: what reproduced and what did not, the diagnosis where not.
        notes: more lines under the table (``""``: none).
        date, commit: when and at which commit; filled in by :func:`write` when empty.
    """

    name: str
    title: str
    scale: str
    paper: str
    command: str
    algorithm: str
    differs: str
    seeds: Sequence[int]
    device: str
    header: Sequence[str]
    rows: Sequence[Sequence[object]]
    verdict: str
    notes: str = ""
    date: str = ""
    commit: str = ""

    def markdown(self) -> str:
        """The file's text (see the module doc); raises ``ValueError`` where a field breaks
        the format, e.g. a row narrower than the header."""
        if not _NAME.match(self.name):
            raise ValueError(
                f"name {self.name!r}: use '<paper>-<table>[-<variant>]' in lower case."
            )
        if not SCALE_LINE.match(f"scale: {self.scale}"):
            raise ValueError(f"scale {self.scale!r}: use 'paper' or 'reduced (<what differs>)'.")
        if len(self.header) < 3 or "paper" not in str(self.header[1]).lower():
            raise ValueError(
                f"header {list(self.header)!r}: the second column is the paper's number "
                "(its name says 'paper') and at least one column of ours follows."
            )
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(
                    f"row {list(row)!r} has {len(row)} cells; header {len(self.header)}."
                )
        facts = {
            "paper": self.paper,
            "command": f"`{self.command.strip()}`",
            "algorithm": self.algorithm,
            "differs": self.differs,
            "seeds": " ".join(str(s) for s in self.seeds),
            "device": self.device,
            "date": self.date or datetime.date.today().isoformat(),
            "commit": self.commit or git_commit(),
        }
        lines = [f"scale: {self.scale}", "", f"# {self.title}", ""]
        lines += [f"- {key}: {facts[key]}" for key in FACTS]
        lines += ["", "| " + " | ".join(map(str, self.header)) + " |"]
        lines += ["|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in self.rows]
        lines += ["", f"**Verdict.** {self.verdict.strip()}"]
        if self.notes.strip():
            lines += ["", self.notes.strip()]
        return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    text = str(value)
    return text.replace("|", "\\|") if "\\|" not in text else text


def write(table: PaperTable, folder: Path = PAPERS) -> Path:
    """Write ``table`` to ``folder/<name>.md`` (the folder made); return the path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{table.name}.md"
    text = table.markdown()
    if path.exists() and _undated(path.read_text()) == _undated(text):
        print(f"paper table: {path} (unchanged)")  # keep the date and commit it was built at
        return path
    path.write_text(text)
    print(f"paper table: {path}")
    return path


def _undated(text: str) -> list[str]:
    """``text``'s lines without its date and commit facts (a rebuild that changes nothing
    else keeps the file as it was)."""
    return [line for line in text.splitlines() if not line.startswith(("- date: ", "- commit: "))]


def check_text(text: str) -> list[str]:
    """What breaks the format in a file's ``text`` (empty: nothing)."""
    problems = []
    lines = text.splitlines()
    if not lines or not SCALE_LINE.match(lines[0]):
        first = lines[0] if lines else ""
        problems.append(
            f"first line {first!r}: must be 'scale: paper' or 'scale: reduced (<what differs>)'"
        )
    if not any(line.startswith("# ") for line in lines[:4]):
        problems.append("no title ('# ...') in the first lines")
    for key in FACTS:
        if not any(
            line.startswith(f"- {key}: ") and line[len(key) + 4 :].strip() for line in lines
        ):
            problems.append(f"no '- {key}: ...' line")
    table = [line for line in lines if line.startswith("|")]
    if len(table) < 3:
        problems.append("no table (a header, a rule and at least one row)")
    elif "paper" not in table[0].split("|")[2].lower():
        problems.append(f"the table's second column is not the paper's: {table[0]!r}")
    if not any(line.startswith("**Verdict.** ") for line in lines):
        problems.append("no '**Verdict.** ...' line")
    return problems


def docs_blocks(page_text: str) -> dict[str, str]:
    """The paper-table blocks of a docs page: name -> body."""
    return {m.group("name"): m.group("body") for m in _BLOCK.finditer(page_text)}


def block_body(file_text: str) -> str:
    """What a docs page shows of a file: the file without its scale line, its title one level
    down (``#`` -> ``###``), the scale said in the facts."""
    lines = file_text.splitlines()
    scale = lines[0]
    rest = lines[1:]
    out = []
    for line in rest:
        if line.startswith("# "):
            out.append("###" + line[1:])
            out += ["", f"- {scale}"]
            continue
        out.append(line)
    while out and not out[0].strip():
        out.pop(0)
    return "\n".join(out).rstrip() + "\n"


def refresh_docs(papers: Path = PAPERS, docs: Path = DOCS) -> list[Path]:
    """Copy every paper-table file into the docs blocks that name it; return the pages
    changed. A block whose file does not exist is left as it is (``check`` reports it)."""
    changed = []
    for page in sorted(docs.glob("*.md")):
        text = page.read_text()

        def body(match: re.Match) -> str:
            path = papers / f"{match.group('name')}.md"
            if not path.exists():
                return match.group(0)
            return match.group(1) + block_body(path.read_text()) + match.group(4)

        new = _BLOCK.sub(body, text)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def check(papers: Path = PAPERS, docs: Path = DOCS) -> list[str]:
    """Every problem: a file that breaks the format, a docs block without its file or unlike
    it, a file no docs page includes."""
    problems = []
    files = {p.stem: p for p in sorted(papers.glob("*.md"))}
    for path in files.values():
        problems += [f"{path.name}: {p}" for p in check_text(path.read_text())]
    included = set()
    for page in sorted(docs.glob("*.md")):
        for name, body in docs_blocks(page.read_text()).items():
            included.add(name)
            if name not in files:
                problems.append(f"{page.name}: block {name!r} has no file {name}.md")
            elif body != block_body(files[name].read_text()):
                problems.append(
                    f"{page.name}: block {name!r} differs from {name}.md; run "
                    "`python -m benchmarks.paper_results --docs`"
                )
    problems += [f"{name}.md: no docs page includes it" for name in files if name not in included]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--build", action="store_true", help="rebuild the files, then --docs")
    action.add_argument("--docs", action="store_true", help="copy the files into docs/papers")
    action.add_argument("--check", action="store_true", help="report what breaks the format")
    args = parser.parse_args(argv)
    if args.build:
        for module in BUILDERS:
            for table in importlib.import_module(module).tables():
                write(table)
    if args.docs or args.build:
        for page in refresh_docs():
            print(f"updated {page}")
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
