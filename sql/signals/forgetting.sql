-- forgetting: tasks that did better before than they do now, in success or in reward.
--
-- Definition. The episodes of a task (rows of run $run_id, phases in $phases, rounds up to
-- $round; success and episode_reward are repeated on every step row of an episode) are
-- grouped into observation points (round, epoch, train_step), ordered in that order with
-- missing epochs/steps last within their round (eval rows come after training). Per point:
-- rate = success rate, reward = mean episode reward (nulls left out of each; a point whose
-- values are all null has none). "Now" is the task's latest point, which must lie in round
-- $round; the earlier points are the task's other points (earlier rounds, or earlier
-- epochs/steps of this round). Against an earlier point the task has
--   a success drop  (earlier rate - now rate) when earlier rate >= $before_min and
--                   now rate <= $now_max, and
--   a reward drop   (earlier reward - now reward) when that difference >= $reward_drop
--                   (the episode reward is in [0, 1] with partial credit, so a task the
--                   policy never solves can still be forgotten).
-- The task is forgotten when some earlier point gives a drop; "before" is the earlier point
-- with the largest drop (the larger of the two; latest among equals). Parse errors do not
-- matter here: an episode whose steps all failed to parse is still an episode that failed.
-- Defaults (SignalsConfig): before_min = 0.5, now_max = 0.0, reward_drop = 0.2.
--
-- signal: forgetting
-- grain: one row per forgotten task of run $run_id at round $round
-- key: task_id
-- param: before_min double = 0.5
-- param: now_max double = 0.0
-- param: reward_drop double = 0.2
-- columns: task_id, score, success_drop, reward_drop, before_rate, before_reward, before_n,
-- columns: before_round, before_epoch, before_step, now_rate, now_reward, now_n, now_epoch,
-- columns: now_step, failing_episode_id
--
-- Parameters: $run_id (varchar), $round (integer), $phases (varchar[]) from the stage;
--             $before_min, $now_max, $reward_drop (signals.forget_* in the config).
--
-- Columns: task_id, score (= the drop, rounded to 12 digits), success_drop and reward_drop
--          (against "before"; null where that criterion does not hold), before_rate,
--          before_reward, before_n, before_round, before_epoch, before_step, now_rate,
--          now_reward, now_n, now_epoch, now_step, failing_episode_id (smallest
--          episode_id of a non-successful episode now).

with steps as (
    select round, phase, episode_id, task_id, epoch, train_step, success, episode_reward
    from rollouts
    where run_id = $run_id and round <= $round and list_contains($phases, phase)
        and task_id is not null  -- a signal must name a task to explore from
),

episodes as (
    select
        round, phase, episode_id, task_id, epoch, train_step,
        bool_or(success) as success, max(episode_reward) as reward
    from steps
    group by all
),

points as (
    select
        task_id, round, epoch, train_step,
        count(*) as n,
        avg(success::double) as rate,
        avg(reward) as reward,
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
    select * from ordered where recency = 1 and round = $round
),

drops as (
    select
        earlier.*,
        case
            when earlier.rate >= $before_min and latest.rate <= $now_max then earlier.rate - latest.rate
        end as success_drop,
        case
            when earlier.reward - latest.reward >= $reward_drop - 1e-9 then earlier.reward - latest.reward
        end as reward_drop
    from ordered as earlier
    join latest using (task_id)
    where earlier.recency > 1
),

best as (
    select *, greatest(success_drop, reward_drop) as drop
    from drops
    where success_drop is not null or reward_drop is not null
    qualify row_number() over (partition by task_id order by round(greatest(success_drop, reward_drop), 12) desc, recency) = 1
),

final as (
    select
        latest.task_id,
        round(best.drop, 12) as score,
        round(best.success_drop, 12) as success_drop,
        round(best.reward_drop, 12) as reward_drop,
        best.rate as before_rate,
        best.reward as before_reward,
        best.n as before_n,
        best.round as before_round,
        best.epoch as before_epoch,
        best.train_step as before_step,
        latest.rate as now_rate,
        latest.reward as now_reward,
        latest.n as now_n,
        latest.epoch as now_epoch,
        latest.train_step as now_step,
        latest.failing_episode_id
    from latest
    join best using (task_id)
)

select * from final order by score desc, task_id
