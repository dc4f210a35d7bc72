-- validation: candidates validated per round, the share accepted (the task pass rate), and the
-- share of the accepted that passed by failure with positive reward (pass_kind 'partial').
-- Grain: one row per (run_id, round).
-- Parameters: $runs (list of run ids; an empty list = every run).
-- Columns: run_id, round, candidates, accepted, pass_rate, partial_share (null: none accepted).
-- Stores written before pass_kind existed: the kind is read from the verdict's reason.
with candidates as (
    select
        run_id, round, verdict,
        coalesce(pass_kind, case
            when reason like 'accepted: pass 2 failed%' then 'partial'
            when reason like 'accepted: pass 2 solved%' then 'success'
        end) as pass_kind
    from candidates
    where len($runs) = 0 or list_contains($runs, run_id)
),

final as (
    select
        run_id,
        round,
        count(*) as candidates,
        count(*) filter (where verdict = 'accepted') as accepted,
        count(*) filter (where verdict = 'accepted') / count(*) as pass_rate,
        count(*) filter (where verdict = 'accepted' and pass_kind = 'partial')
        / nullif(count(*) filter (where verdict = 'accepted'), 0) as partial_share
    from candidates
    group by run_id, round
)

select * from final
order by run_id, round
