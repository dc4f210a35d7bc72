-- signals: how many signals of each type the selected runs mined per round.
-- Grain: one row per (run_id, round, signal_type).
-- Parameters: $runs (list of run ids; an empty list = every run).
-- Columns: run_id, round, signal_type, n.
with signals as (
    select run_id, round, signal_type from signals
    where len($runs) = 0 or list_contains($runs, run_id)
),

final as (
    select run_id, round, signal_type, count(*) as n
    from signals
    group by run_id, round, signal_type
)

select * from final
order by run_id, round, signal_type
