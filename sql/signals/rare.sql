-- rare: action patterns that are repeated but globally infrequent.
--
-- Grain: one row per rare pattern of run $run_id at round $round.
--
-- Definition. An episode's action sequence is its steps of round $round (rows of run
-- $run_id, phases in $phases) that called a tool (action_name not null), ordered by
-- (turn, step); steps with a parse error are left out unless $include_parse_errors (what
-- the model failed to say is not an action it took). A pattern is an n-gram of $n
-- consecutive actions of that sequence (never spanning two episodes), written
-- 'a > b'; with $with_arg_keys each action is written with its sorted argument keys,
-- 'a(k1,k2) > b()'. Over all n-grams of the round, a pattern is rare when it occurs in
-- at least $min_episodes distinct episodes and its share of all n-gram occurrences is
-- <= $max_share.
--
-- Parameters: $run_id (varchar), $round (integer), $phases (varchar[]), $n (integer),
--             $with_arg_keys (boolean), $include_parse_errors (boolean),
--             $min_episodes (integer), $max_share (double), $evidence_limit (integer).
--
-- Columns: pattern, score (= total occurrences / pattern occurrences, inverse frequency,
--          rounded to 12 digits), n_occurrences, n_episodes, share, total,
--          actions (the pattern's action names), task_ids and episode_ids (sorted,
--          distinct, the first $evidence_limit of each).

with steps as (
    select
        phase, episode_id, task_id, turn, step,
        case
            when $with_arg_keys
                then action_name || '('
                    || coalesce(array_to_string(list_sort(try(json_keys(action_args))), ','), '') || ')'
            else action_name
        end as token
    from rollouts
    where run_id = $run_id and round = $round and list_contains($phases, phase)
        and action_name is not null and ($include_parse_errors or parse_error is null)
),

grams as (
    select
        phase, episode_id, task_id,
        list(token) over (
            partition by phase, episode_id
            order by turn, step
            rows between current row and ($n - 1) following
        ) as tokens
    from steps
),

per_episode as materialized (
    select array_to_string(tokens, ' > ') as pattern, phase, episode_id, task_id, count(*) as c
    from grams
    where len(tokens) = $n
    group by all
),

counts as (
    select pattern, sum(c)::bigint as n_occurrences, count(*) as n_episodes
    from per_episode
    group by pattern
),

rare as (
    select pattern, n_occurrences, n_episodes, n_occurrences / total as share, total
    from (select *, (sum(n_occurrences) over ())::bigint as total from counts)
    where n_episodes >= $min_episodes and n_occurrences / total <= $max_share
),

evidence as (
    select
        pattern,
        list_slice(list(distinct task_id order by task_id), 1, $evidence_limit) as task_ids,
        list_slice(list(distinct episode_id order by episode_id), 1, $evidence_limit) as episode_ids
    from per_episode
    where pattern in (select pattern from rare)
    group by pattern
),

final as (
    select
        pattern,
        round(total / n_occurrences, 12) as score,
        n_occurrences, n_episodes, share, total,
        list_transform(string_split(pattern, ' > '), lambda t: split_part(t, '(', 1)) as actions,
        task_ids, episode_ids
    from rare
    join evidence using (pattern)
)

select * from final order by score desc, pattern
