-- task_turns: turn counts of the synthesized tasks (origin other than 'seed') committed per round.
-- Grain: one row per (round, n_turns). Pools are per store, so this reads the whole store.
-- Parameters: none.
-- Columns: round, n_turns, n.
with tasks as (
    select round, len(turns) as n_turns from tasks
    where split = 'train' and coalesce(origin, '') <> 'seed'
),

final as (
    select round, n_turns, count(*) as n
    from tasks
    group by round, n_turns
)

select * from final
order by round, n_turns
