-- rounds: the `rounds` rows of the selected runs, every column (plots read what they need by name).
-- Grain: one row per (run_id, round).
-- Parameters: $runs (list of run ids; an empty list = every run).
-- Columns: see coevolve/schemas.py ROUNDS, plus `round`.
with rounds as (
    select * from rounds
),

final as (
    select * from rounds
    where len($runs) = 0 or list_contains($runs, run_id)
)

select * from final
order by run_id, round
