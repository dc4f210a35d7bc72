-- forgetting: tasks that were solved before and now fail.
--
-- Grain: one row per forgotten task of run $run_id at round $round.
--
-- Definition. The episodes of a task (rows of run $run_id, phases in $phases, rounds up to
-- $round; success is repeated on every step row of an episode) are grouped into
-- observation points (round, epoch, train_step), ordered in that order with missing
-- epochs/steps last within their round (eval rows come after training). "Now" is the
-- task's latest point, which must lie in round $round; "before" is the best earlier point
-- (highest success rate; latest among equals), in an earlier round or at an earlier
-- epoch/step of this round. A task is forgotten when rate_before >= $before_min and
-- rate_now <= $now_max. Rates ignore episodes whose success is null; a point whose
-- episodes are all null has no rate and can be neither. Parse errors do not matter here:
-- an episode whose steps all failed to parse is still an episode that failed.
--
-- Parameters: $run_id (varchar), $round (integer), $phases (varchar[]),
--             $before_min (double), $now_max (double).
--
-- Columns: task_id, score (= rate_before - rate_now, rounded to 12 digits), before_rate,
--          before_n, before_round, before_epoch, before_step, now_rate, now_n, now_epoch,
--          now_step, failing_episode_id (smallest episode_id of a non-successful episode now).

with steps as (
    select round, phase, episode_id, task_id, epoch, train_step, success
    from rollouts
    where run_id = $run_id and round <= $round and list_contains($phases, phase)
        and task_id is not null  -- a signal must name a task to explore from
),

episodes as (
    select round, phase, episode_id, task_id, epoch, train_step, bool_or(success) as success
    from steps
    group by all
),

points as (
    select
        task_id, round, epoch, train_step,
        count(*) as n,
        avg(success::double) as rate,
        min(episode_id) filter (where success is distinct from true) as failing_episode_id
    from episodes
    group by all
),

ordered as (
    select
        *,
        row_number() over (
            partition by task_id
            order by round desc, epoch desc nulls first, train_step desc nulls first
        ) as recency
    from points
),

latest as (
    select * from ordered where recency = 1 and round = $round and rate <= $now_max
),

earlier as (
    select *
    from ordered
    where recency > 1 and rate >= $before_min and task_id in (select task_id from latest)
    qualify row_number() over (partition by task_id order by rate desc, recency) = 1
),

final as (
    select
        latest.task_id,
        round(earlier.rate - latest.rate, 12) as score,
        earlier.rate as before_rate,
        earlier.n as before_n,
        earlier.round as before_round,
        earlier.epoch as before_epoch,
        earlier.train_step as before_step,
        latest.rate as now_rate,
        latest.n as now_n,
        latest.epoch as now_epoch,
        latest.train_step as now_step,
        latest.failing_episode_id
    from latest
    join earlier using (task_id)
)

select * from final order by score desc, task_id
