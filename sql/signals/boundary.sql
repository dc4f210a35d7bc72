-- boundary: tasks whose samples in the current round disagree (the edge of competence).
--
-- Definition. The task's episodes of round $round (rows of run $run_id, phases in $phases;
-- success and episode_reward are repeated on every step row of an episode) are pooled over
-- all epochs and training steps of the round. A task is on the boundary when
--   at least $min_samples episodes have a success value and 0 < success rate < 1, or
--   at least $min_samples episodes have a reward and the population variance of the
--   episode rewards >= $min_reward_var (the caller passes the square of the std threshold).
-- Null successes and null rewards are left out of their statistic, not counted as 0.
-- The variance test allows 1e-9 of rounding: rewards are fractions such as k/4 and a
-- variance exactly at the threshold must not flip with the order of summation.
-- The reward test makes the boundary visible before the policy solves anything: the episode
-- reward has partial credit (reference effects reproduced), so samples of a task the policy
-- never solves still spread. Defaults (SignalsConfig): min_samples = 4, reward std >= 0.1
-- (min_reward_var = 0.01).
--
-- signal: boundary
-- grain: one row per boundary task of run $run_id at round $round
-- key: task_id
-- param: min_samples integer = 4
-- param: min_reward_var double = 0.01
-- columns: task_id, score, n, n_success, rate, n_reward, reward_var, failing_episode_id
--
-- Parameters: $run_id (varchar), $round (integer), $phases (varchar[]) from the stage;
--             $min_samples (signals.boundary_min_samples), $min_reward_var (the square of
--             signals.boundary_reward_std).
--
-- Columns: task_id, score (= max(p(1-p), reward variance), rounded to 12 digits so that
--          ties stay ties whatever the order of summation), n (episodes), n_success
--          (episodes with a success value), rate, n_reward, reward_var,
--          failing_episode_id (smallest episode_id of a non-successful episode).

with steps as (
    select phase, episode_id, task_id, success, episode_reward
    from rollouts
    where run_id = $run_id and round = $round and list_contains($phases, phase)
        and task_id is not null  -- a signal must name a task to explore from
),

episodes as (
    select phase, episode_id, task_id, bool_or(success) as success, max(episode_reward) as reward
    from steps
    group by all
),

tasks as (
    select
        task_id,
        count(*) as n,
        count(success) as n_success,
        avg(success::double) as rate,
        count(reward) as n_reward,
        var_pop(reward) as reward_var,
        min(episode_id) filter (where success is distinct from true) as failing_episode_id
    from episodes
    group by task_id
),

final as (
    select
        task_id,
        round(greatest(coalesce(rate * (1 - rate), 0), coalesce(reward_var, 0)), 12) as score,
        n, n_success, rate, n_reward, reward_var, failing_episode_id
    from tasks
    where (n_success >= $min_samples and rate > 0 and rate < 1)
       or (n_reward >= $min_samples and reward_var >= $min_reward_var - 1e-9)
)

select * from final order by score desc, task_id
