-- summary: held-out score of an ablation, mean and spread over seeds.
-- Grain: one row per (condition, round); round 0 is the base policy (zero-shot).
-- Parameters: none (reads the `ablations` view).
-- Columns: condition, round, seeds (runs that finished the round), mean, std (sample std, null for one seed),
--          min, max (of the success rate), mean_reward, min_reward, max_reward (held-out partial-credit
--          reward: what moves at scales where no held-out entry passes every turn),
--          mean_synth, mean_synth_reward (the held-out synthesized split: success and reward; null without one).
with ablations as (
    select condition, round, seed, eval_score, eval_reward, synth_score, synth_reward from ablations
),

final as (
    select
        condition,
        round,
        count(distinct seed) as seeds,
        avg(eval_score) as mean,
        stddev_samp(eval_score) as std,
        min(eval_score) as min,
        max(eval_score) as max,
        avg(eval_reward) as mean_reward,
        min(eval_reward) as min_reward,
        max(eval_reward) as max_reward,
        avg(synth_score) as mean_synth,
        avg(synth_reward) as mean_synth_reward
    from ablations
    group by condition, round
)

select * from final
order by condition, round
