-- pool_growth: how the pool grew, version by version, by where the added tasks came from.
-- Grain: one row per (pool version, origin, signal_type) of the tasks that version added;
-- origin: static (round 0, synthesized from training-scenario states) | explored (later rounds)
--         | heldout (round 0: the held-out synthesized split, evaluation only);
-- signal_type: what guided the exploration (forgetting | boundary | rare | fallback | random | static).
-- Parameters: none.
-- Columns: version, round, run_id (the run that committed it), origin, signal_type,
--          added (tasks of that kind the version added), pool_size (tasks in the version).
with versions as (
    select version, round, run_id, task_count, added from pool_versions
),

added as (
    select version, round, run_id, task_count, unnest(added) as task_id from versions
),

tasks as (
    select task_id, coalesce(origin, 'unknown') as origin, coalesce(signal_type, 'none') as signal_type from tasks
),

final as (
    select
        added.version,
        added.round,
        added.run_id,
        tasks.origin,
        tasks.signal_type,
        count(*) as added,
        any_value(added.task_count) as pool_size
    from added
    inner join tasks on tasks.task_id = added.task_id
    group by added.version, added.round, added.run_id, tasks.origin, tasks.signal_type
)

select * from final
order by version, origin, signal_type
