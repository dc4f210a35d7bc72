-- task_lineage: where a pool task came from: its candidate, the signal that guided the
-- exploration, the context task whose state the exploration started from, and the exploration run.
-- Grain: one row per task of the pool (or the one task $task_id); tasks no candidate produced
-- (hand-committed seeds) have null lineage columns.
-- Parameters: $task_id (a task id; '' = every task).
-- Columns: task_id, created_round, origin, signal_type, signal_id, signal_task_id (the task the
--          signal was about; null for rare patterns and coverage contexts), signal_pattern,
--          signal_score, context_task_id, context_origin, context_created_round,
--          exploration_run (run_idx), exploration_steps, exploration_actions (tool calls, in order),
--          candidate_id, verdict_reason.
with wanted as (
    select task_id, created_round, origin, signal_type from tasks
    where $task_id = '' or task_id = $task_id
),

candidates as (
    select
        json_extract_string(spec, '$.task_id') as task_id,
        run_id, round, candidate_id, signal_id, context_task_id, source_run, reason
    from candidates
    where verdict = 'accepted'
),

signals as (
    select run_id, round, signal_id, task_id as signal_task_id, pattern as signal_pattern, score as signal_score
    from signals
),

runs as (
    select
        run_id, round, signal_id, run_idx,
        count(*) as exploration_steps,
        string_agg(action_name, ' > ' order by step) as exploration_actions
    from explorations
    group by run_id, round, signal_id, run_idx
),

contexts as (
    select task_id, origin as context_origin, created_round as context_created_round from tasks
),

final as (
    select
        wanted.task_id,
        wanted.created_round,
        wanted.origin,
        wanted.signal_type,
        candidates.signal_id,
        signals.signal_task_id,
        signals.signal_pattern,
        signals.signal_score,
        candidates.context_task_id,
        contexts.context_origin,
        contexts.context_created_round,
        candidates.source_run as exploration_run,
        runs.exploration_steps,
        runs.exploration_actions,
        candidates.candidate_id,
        candidates.reason as verdict_reason
    from wanted
    left join candidates on candidates.task_id = wanted.task_id and candidates.round = wanted.created_round
    left join signals
        on signals.run_id = candidates.run_id and signals.round = candidates.round
        and signals.signal_id = candidates.signal_id
    left join runs
        on runs.run_id = candidates.run_id and runs.round = candidates.round
        and runs.signal_id = candidates.signal_id and runs.run_idx = candidates.source_run
    left join contexts on contexts.task_id = candidates.context_task_id
)

select * from final
order by created_round, task_id
