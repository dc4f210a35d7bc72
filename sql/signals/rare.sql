-- rare: action patterns that are repeated but infrequent relative to the round.
--
-- Definition. An episode's action sequence is its steps of round $round (rows of run
-- $run_id, phases in $phases) that called a tool (action_name not null), ordered by
-- (turn, step); steps with a parse error are left out unless $include_parse_errors (what
-- the model failed to say is not an action it took), and so are calls of a name the
-- environment does not have (error 'unknown function ...', the environments' shared
-- wording): an invented function is no behaviour to explore. A pattern is an n-gram of $n
-- consecutive actions of that sequence (never spanning two episodes), written
-- 'a > b'; with $with_arg_keys each action is written with its sorted argument keys,
-- 'a(k1,k2) > b()'. The candidates are the patterns seen in at least $min_episodes
-- distinct episodes (repeated behaviour, not a one-off). A candidate is rare when
--   the round has at least $min_total n-gram occurrences in all (fewer says nothing), and
--   its occurrence count is <= the cutoff, the lower $quantile quantile of the candidates'
--   counts (quantile_disc: the count at 0-based position floor($quantile * (k - 1)) of the
--   k candidates sorted by count), and
--   its count is below the most frequent candidate's (a pattern as common as the most
--   common one is not rare, whatever the quantile says when all counts tie).
-- The cutoff moves with the round: a round of 16 episodes with a dozen n-grams has rare
-- patterns as surely as one of a million; an absolute share cap would leave small rounds
-- barren. Defaults (SignalsConfig): n = 2, min_episodes = 2, quantile = 0.25, min_total = 8.
--
-- signal: rare
-- grain: one row per rare action pattern of run $run_id at round $round
-- key: pattern
-- param: n integer = 2
-- param: with_arg_keys boolean = false
-- param: include_parse_errors boolean = false
-- param: min_episodes integer = 2
-- param: quantile double = 0.25
-- param: min_total integer = 8
-- param: evidence_limit integer = 10
-- columns: pattern, score, n_occurrences, n_episodes, share, total, cutoff, actions, task_ids,
-- columns: episode_ids
--
-- Parameters: $run_id (varchar), $round (integer), $phases (varchar[]) from the stage;
--             $n, $with_arg_keys, $include_parse_errors, $min_episodes, $quantile,
--             $min_total, $evidence_limit (signals.rare_* and evidence_limit in the config).
--
-- Columns: pattern, score (= total occurrences / pattern occurrences, inverse frequency,
--          rounded to 12 digits), n_occurrences, n_episodes, share (of all n-gram
--          occurrences), total, cutoff (the candidates' count quantile), actions (the
--          pattern's action names), task_ids and episode_ids (sorted, distinct, the first
--          $evidence_limit of each).

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
        and (error is null or not starts_with(error, 'unknown function '))
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

totals as (
    select sum(n_occurrences)::bigint as total from counts
),

candidates as (
    select * from counts where n_episodes >= $min_episodes
),

cutoffs as (
    select
        quantile_disc(n_occurrences, $quantile) as cutoff,
        max(n_occurrences) as top
    from candidates
),

rare as (
    select pattern, n_occurrences, n_episodes, n_occurrences / total as share, total, cutoff
    from candidates, totals, cutoffs
    where total >= $min_total and n_occurrences <= cutoff and n_occurrences < top
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
        n_occurrences, n_episodes, share, total, cutoff,
        list_transform(string_split(pattern, ' > '), lambda t: split_part(t, '(', 1)) as actions,
        task_ids, episode_ids
    from rare
    join evidence using (pattern)
)

select * from final order by score desc, pattern
