-- validation: candidates validated per round and the share accepted (the task pass rate).
-- Grain: one row per (run_id, round).
-- Parameters: $runs (list of run ids; an empty list = every run).
-- Columns: run_id, round, candidates, accepted, pass_rate.
with candidates as (
    select run_id, round, verdict from candidates
    where len($runs) = 0 or list_contains($runs, run_id)
),

final as (
    select
        run_id,
        round,
        count(*) as candidates,
        count(*) filter (where verdict = 'accepted') as accepted,
        count(*) filter (where verdict = 'accepted') / count(*) as pass_rate
    from candidates
    group by run_id, round
)

select * from final
order by run_id, round
