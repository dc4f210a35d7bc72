"""Benchmarks: one module per ``coevolve bench`` command, each a plain function that measures
and returns (or prints through the ``echo`` it is given) its figures.

    coevolve bench --help          # the commands; their thin wrappers are in coevolve/cli/bench.py
    make bench                     # the quick benches, sized to run in a few minutes on 2 cores

- ``safety``: injection-derived attacks refused, legitimate tasks refused with them;
- ``tasks``: quality-gate verdicts and shape figures of a store's latest pool.
"""
