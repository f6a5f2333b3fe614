"""The benchmark scripts: each module regenerates the tables or figures of a docs page.

Run one from the repository root as ``python -m benchmarks.<name> [options]`` (for example
``python -m benchmarks.fedgmm_pfl --quick``); ``--help`` lists its options and its module
docstring what it measures. :mod:`benchmarks.common` holds what the scripts share (options,
summaries, the markdown table, data set-up, machine facts and the report). The package is
not part of the installed wheel.
"""
