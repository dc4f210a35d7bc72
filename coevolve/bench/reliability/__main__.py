"""The child processes of the fault campaign: ``python -m coevolve.bench.reliability child ...``
(one run of the kill and fault scenarios, ``kill.child_run``) and ``... committer ...`` (one
committing process of the concurrent scenarios, ``concurrent.committer``).
"""

from __future__ import annotations

import argparse
import json
import sys

from coevolve.bench.reliability.concurrent import committer
from coevolve.bench.reliability.kill import child_run
from coevolve.bench.reliability.parts import torn_child


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m coevolve.bench.reliability")
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("child")
    c.add_argument("--config")
    c.add_argument("--overrides", default="{}")
    c.add_argument("--target")
    c.add_argument("--trace")
    m = sub.add_parser("committer")
    for a in ("store", "endpoint", "run-id", "tag", "go", "out"):
        m.add_argument(f"--{a}", default="")
    m.add_argument("--n", type=int, default=1)
    t = sub.add_parser("torn")
    t.add_argument("--store", required=True)
    t.add_argument("--rounds", type=int, default=1)
    t.add_argument("--target")
    t.add_argument("--trace")
    args = parser.parse_args(argv)
    if args.cmd == "child":
        child_run(args.config, json.loads(args.overrides), json.loads(args.target) if args.target else None, args.trace)
    elif args.cmd == "torn":
        torn_child(args.store, args.rounds, json.loads(args.target) if args.target else None, args.trace)
    else:
        committer(args.store, args.endpoint, args.run_id, args.tag, args.n, args.go, args.out)


if __name__ == "__main__":
    _main(sys.argv[1:])
