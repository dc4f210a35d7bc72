-- pool_origins: the training split of each committed pool version, counted by task origin.
-- Grain: one row per (run_id, round, origin); run_id is the run that committed the version.
-- A version holds every train task committed in its round or earlier (pools only grow today).
-- Parameters: $runs (list of run ids; an empty list = every run).
-- Columns: run_id, round, origin, n.
with versions as (
    select run_id, round from pool_versions
    where len($runs) = 0 or list_contains($runs, run_id)
),

tasks as (
    select round as committed_round, coalesce(origin, 'unknown') as origin from tasks
    where split = 'train'
),

final as (
    select versions.run_id, versions.round, tasks.origin, count(*) as n
    from versions
    inner join tasks on tasks.committed_round <= versions.round
    group by versions.run_id, versions.round, tasks.origin
)

select * from final
order by run_id, round, origin
