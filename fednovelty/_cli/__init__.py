"""Parts of the ``fednovelty`` command (:mod:`fednovelty.cli` builds the parser and runs it).

- :mod:`~fednovelty._cli.files`: checks of input and output paths, atomic writes, reading a
  table, argparse number types, and :class:`~fednovelty._cli.files.UsageError`;
- :mod:`~fednovelty._cli.choices`: the parser's fixed choices (no torch, PyOD or
  scikit-learn import to print help) and "did you mean" for a mistyped choice;
- :mod:`~fednovelty._cli.tables`: a table's checks (a repeated column name, a missing named
  column with the closest names, a column of text);
- :mod:`~fednovelty._cli.scoring`: ``score``'s table, under each client's own model;
- :mod:`~fednovelty._cli.progress`: ``--no-progress`` of every command that draws a bar;
- :mod:`~fednovelty._cli.bench`: ``fednovelty bench`` (the grid, its figures, its folder);
- :mod:`~fednovelty._cli.dashboard`: ``fednovelty app`` (where the installed dashboard is,
  the ``streamlit run`` command line, a served dashboard for tests and benchmarks);
- :mod:`~fednovelty._cli.flower`: ``fednovelty flower new`` (a Flower app from the package's
  template).
"""
