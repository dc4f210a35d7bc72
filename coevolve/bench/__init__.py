"""Benchmarks: one module per ``coevolve bench`` command, each plain functions that measure and
return (or print through the ``echo`` they are given) their figures. Their thin command-line
wrappers are in ``coevolve/cli/bench.py`` (``bench env``'s in ``coevolve/cli/eval.py``).

    coevolve bench --help          # the commands, each with its options
    make bench                     # the quick sizes of them all: a few minutes on 2 cores

- ``signals``: the signal queries (DuckDB) against a pandas reference on a synthetic log
  (``signals_log``: the log generator; ``signals_pandas``: the reference);
- ``env``: replaying and scoring every entry's ground truth, env only and through the engine;
- ``validate``: candidate validation's mechanical part and pass 2's attempts per second;
- ``rollout``: the rollout engine's tokens/s, batched vs one episode at a time;
- ``train``: the local trainer's update step vs plain torch (+ peft), and a whole GRPO step;
- ``sft``: first-call quality before and after a short LoRA SFT warm start;
- ``reliability``: the fault campaign (kills, concurrent commits, S3 faults, fuzz), a package;
- ``safety``: injection-derived attacks refused, legitimate tasks refused with them;
- ``tasks``: quality-gate verdicts and shape figures of a store's latest pool.

``bench fanout`` (in-process vs a task runner) is in ``coevolve/cli/bench_fanout.py``.
"""
