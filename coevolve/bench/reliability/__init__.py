"""Fault campaign: kill runs anywhere, commit concurrently, break S3, fuzz model output.

``coevolve bench reliability`` (``make chaos``) runs these scenarios and prints, per
scenario, tried / survived / rows lost / rows duplicated / corrupt pool versions:

- ``kill``: a reference run of ``rounds`` rounds, then a chain of runs on a fresh store,
  each SIGKILLed at the next of ``kills`` random points (a store operation of a stage,
  just before or just after it: inside table writes, markers, pool commits between
  manifest and pointer, ...), each resuming what the previous left; a last run completes.
  Points cover every stage of ``coevolve.round.STAGES`` (whatever they are) and the seeding
  before them. The final tables must hold exactly the reference run's keys.
- ``concurrent-local`` / ``concurrent-s3``: ``procs`` processes commit ``commits`` pool
  versions each, at once, with one shared run id and with one run id each; on a local
  store and on S3 (moto on loopback). Every commit must land exactly once and every
  committed version must read back.
- ``s3-faults``: the same S3 commits, then ``fault_rounds`` rounds of a run, through a
  loopback proxy that answers 5xx, resets connections (before or after forwarding) and
  stalls, at ``fault_rate``; a run either completes or fails with a clear error, and reruns
  complete with the reference run's keys.
- ``torn-writes``: a chain of synthetic runs (every table, no model), each SIGKILLed at one of
  ``kills`` points inside a part's write (file written, manifest updated, old file deleted) or
  its stage marker, each resuming; after every kill the store verifies clean and reads.
- ``damaged-parts`` / ``damaged-parts-s3``: in every table, a recorded part truncated,
  zero-filled, emptied and deleted (readers must refuse it naming table and file), and a
  foreign-schema file and a stray part planted (readers must return exactly the reference rows).
- ``fuzz``: ``fuzz`` mutated model outputs through the tool-call parser and the BFCL
  environment's dispatcher: 0 uncaught exceptions.

One module per scenario (``kill``, ``parts``, ``concurrent``, ``faults``, ``fuzz``); what they share
(``common``: the config, a scenario's result, the store checks, child runs); the runner
(``campaign``: ``run_campaign(CampaignConfig(...))``, ``format_table``); the child processes'
entry (``__main__``: ``python -m coevolve.bench.reliability child|committer ...``); the S3 pieces
(``s3_faults``: moto on loopback, the faulty proxy). Every process the campaign starts is
accounted for at the end (``leftover`` processes are reported and killed).
"""
