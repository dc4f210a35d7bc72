-- uncertainty: tasks the policy acts on with low confidence while its outcomes are mixed.
--
-- signal: uncertainty
-- grain: one row per uncertain task of run $run_id at round $round
-- key: task_id
-- param: min_samples integer = 2
-- param: max_mean_logprob double = -0.08
-- param: quantile double = 0.5
-- param: low_logprob double = -0.6931471805599453
-- columns: task_id, score, n, n_success, rate, reward_var, mean_logprob, low_token_share,
-- columns: n_messages, n_tokens, cutoff, failing_episode_id
--
-- Definition. The behaviour log-probs are logged per model message, on the message's first
-- step row (completion_logprobs: each sampled token's log-prob under the sampling
-- distribution, coevolve.policy.base.Generation). The tool-call messages of a task are its
-- messages of round $round (rows of run $run_id, phases in $phases) that called a tool
-- (action_name not null) and have log-probs. Over all their tokens:
--   mean_logprob     = the mean token log-prob (the value estimate's confidence, per token),
--   low_token_share  = the share of tokens with log-prob < $low_logprob (default ln 0.5:
--                      tokens the policy gave less than even odds; a small top-2 margin).
-- The task's outcomes are mixed when at least $min_samples episodes have an outcome and
-- either 0 < success rate < 1 or the episode rewards are not all equal (any spread: the
-- partial credit moves). A task is uncertain when its outcomes are mixed and its
-- mean_logprob is low, absolutely (<= $max_mean_logprob) or relative to the round (<= the
-- cutoff, the $quantile quantile (quantile_cont) of the mean_logprob of the round's tasks
-- with tool-call tokens): the policy is unsure of the calls it makes where those calls
-- sometimes pay and sometimes not. The relative test keeps the signal alive as training
-- sharpens the policy (confidence drifts up every round, as rare's cutoff moves with the
-- round). (The backends log the sampled token's
-- log-prob only, not the runner-up's, so the top-2 margin is read as the share of tokens
-- below even odds.)
-- Defaults: max_mean_logprob = -0.08 and quantile = 0.5. On the embedded default's SmolLM2
-- after its SFT warm start, tool-call messages of training tasks average -0.04 to -0.15 per
-- token (tests/data/default-store), and -0.04 to -0.06 with the role-typed seed pool: the
-- absolute test alone can miss a whole round, the median never leaves a round of mixed
-- tasks without its less confident half.
--
-- Parameters: $run_id (varchar), $round (integer), $phases (varchar[]) from the stage;
--             $min_samples (integer), $max_mean_logprob (double), $quantile (double),
--             $low_logprob (double)
--             (signals.params.uncertainty in the config).
--
-- Columns: task_id, score (= -mean_logprob, rounded to 12 digits: higher is less sure),
--          n (episodes), n_success, rate, reward_var, mean_logprob, low_token_share,
--          n_messages (tool-call messages with log-probs), n_tokens, cutoff (the round's
--          quantile), failing_episode_id
--          (smallest episode_id of a non-successful episode).

with steps as (
    select
        phase, episode_id, task_id, success, episode_reward,
        case when action_name is not null then completion_logprobs end as logprobs
    from rollouts
    where run_id = $run_id and round = $round and list_contains($phases, phase)
        and task_id is not null  -- a signal must name a task to explore from
),

episodes as (
    select
        phase, episode_id, task_id,
        bool_or(success) as success,
        max(episode_reward) as reward,
        count(logprobs) as n_messages,
        sum(len(logprobs)) as n_tokens,
        sum(list_sum(logprobs)) as sum_logprob,
        sum(len(list_filter(logprobs, lambda lp: lp < $low_logprob))) as n_low
    from steps
    group by all
),

tasks as (
    select
        task_id,
        count(*) as n,
        count(success) as n_success,
        avg(success::double) as rate,
        var_pop(reward) as reward_var,
        count(reward) as n_reward,
        max(reward) > min(reward) as reward_spread,
        sum(n_messages)::bigint as n_messages,
        sum(n_tokens)::bigint as n_tokens,
        sum(sum_logprob) / sum(n_tokens) as mean_logprob,
        sum(n_low) / sum(n_tokens) as low_token_share,
        min(episode_id) filter (where success is distinct from true) as failing_episode_id
    from episodes
    group by task_id
),

cutoffs as (
    select quantile_cont(mean_logprob, $quantile) as cutoff from tasks where n_tokens > 0
),

final as (
    select
        task_id,
        round(-mean_logprob, 12) as score,
        n, n_success, rate, reward_var,
        round(mean_logprob, 12) as mean_logprob,
        low_token_share, n_messages, n_tokens,
        round(cutoff, 12) as cutoff,
        failing_episode_id
    from tasks, cutoffs
    where n_tokens > 0
        and (mean_logprob <= $max_mean_logprob or mean_logprob <= cutoff)
        and (
            (n_success >= $min_samples and rate > 0 and rate < 1)
            or (n_reward >= $min_samples and reward_spread)
        )
)

select * from final order by score desc, task_id
