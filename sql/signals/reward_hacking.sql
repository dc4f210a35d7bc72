-- reward_hacking: tasks whose training reward comes without the success it should stand for.
--
-- signal: reward_hacking
-- grain: one row per task of run $run_id at round $round whose reward outruns its success
-- key: task_id
-- param: min_samples integer = 2
-- param: min_reward double = 0.25
-- param: min_rise double = 0.15
-- columns: task_id, score, kind, n, rate, reward, progress, format, ever_solved,
-- columns: before_round, before_rate, before_reward, reward_rise, failing_episode_id
--
-- Definition. The task's episodes (rows of run $run_id, phases in $phases; success, the
-- episode reward and its parts are repeated on every step row of an episode) are grouped
-- per round, up to $round. "Now" is round $round (at least $min_samples episodes); "before"
-- is the task's latest earlier round. Two ways for reward to outrun success:
--   partial  the task was never solved by the run (no successful episode in any round up to
--            $round) and yet its mean episode reward now is >= $min_reward: the reward is
--            partial credit (reference effects reproduced, well-formed calls) on a task the
--            policy never completes;
--   rise     the mean reward rose by >= $min_rise since "before" while the success rate did
--            not rise: the policy learned to earn reward, not to solve the task.
-- kind is 'partial', 'rise' or 'partial+rise'; score = the larger of the mean reward (for
-- partial) and the rise (for rise). The round summary warns when this signal fires
-- (coevolve.round: rounds.warnings).
--
-- Parameters: $run_id (varchar), $round (integer), $phases (varchar[]) from the stage;
--             $min_samples (integer), $min_reward (double), $min_rise (double)
--             (signals.params.reward_hacking in the config).
--
-- Columns: task_id, score (rounded to 12 digits), kind, n (episodes now), rate (success
--          rate now), reward (mean episode reward now), progress and format (mean reward
--          parts now; null where the environment has none), ever_solved, before_round,
--          before_rate, before_reward, reward_rise (null without an earlier round),
--          failing_episode_id (smallest episode_id of a non-successful episode now).

with steps as (
    select round, phase, episode_id, task_id, success, episode_reward, reward_progress, reward_format
    from rollouts
    where run_id = $run_id and round <= $round and list_contains($phases, phase)
        and task_id is not null  -- a signal must name a task to explore from
),

episodes as (
    select
        round, phase, episode_id, task_id,
        bool_or(success) as success,
        max(episode_reward) as reward,
        max(reward_progress) as progress,
        max(reward_format) as format
    from steps
    group by all
),

rounds as (
    select
        task_id, round,
        count(*) as n,
        avg(success::double) as rate,
        avg(reward) as reward,
        avg(progress) as progress,
        avg(format) as format,
        bool_or(coalesce(success, false)) as solved,
        min(episode_id) filter (where success is distinct from true) as failing_episode_id
    from episodes
    group by all
),

now as (
    select * from rounds where round = $round and n >= $min_samples
),

before as (
    select * from rounds where round < $round
    qualify row_number() over (partition by task_id order by round desc) = 1
),

ever as (
    select task_id, bool_or(solved) as ever_solved from rounds group by task_id
),

judged as (
    select
        now.*,
        ever.ever_solved,
        before.round as before_round,
        before.rate as before_rate,
        before.reward as before_reward,
        now.reward - before.reward as reward_rise,
        not ever.ever_solved and now.reward >= $min_reward - 1e-9 as is_partial,
        coalesce(
            now.reward - before.reward >= $min_rise - 1e-9 and coalesce(now.rate, 0) <= coalesce(before.rate, 0),
            false
        ) as is_rise
    from now
    join ever using (task_id)
    left join before using (task_id)
),

final as (
    select
        task_id,
        round(greatest(
            case when is_partial then reward end,
            case when is_rise then reward_rise end
        ), 12) as score,
        case
            when is_partial and is_rise then 'partial+rise'
            when is_partial then 'partial'
            else 'rise'
        end as kind,
        n, rate, reward, progress, format, ever_solved,
        before_round, before_rate, before_reward,
        round(reward_rise, 12) as reward_rise,
        failing_episode_id
    from judged
    where is_partial or is_rise
)

select * from final order by score desc, task_id
