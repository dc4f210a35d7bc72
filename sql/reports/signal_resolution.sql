-- signal_resolution: what became of each round's signals in the rounds after it.
-- Grain: one row per (run_id, round, signal_type) of the signals table.
-- A signal is explored when exploration ran from it, yields tasks when validation accepted a
-- candidate of it, recurs when a later round of the run signalled the same task or pattern
-- again, is solved later when its task (task signals only) succeeded in a later round's
-- training or evaluation rollouts, and is resolved when it is solved later and never recurs.
-- Parameters: none.
-- Columns: run_id, round, signal_type, signals, explored, yielded_tasks (accepted candidates),
--          recurred, solved_later, resolved, later_rounds (rounds of the run after this one).
with signals as (
    select run_id, round, signal_id, signal_type, coalesce(task_id, pattern) as target, task_id
    from signals
),

explored as (
    select distinct run_id, round, signal_id from explorations
),

accepted as (
    select run_id, round, signal_id, count(*) as n from candidates
    where verdict = 'accepted'
    group by run_id, round, signal_id
),

solved as (
    select run_id, round, task_id from rollouts
    where success and phase in ('train', 'eval')
    group by run_id, round, task_id
),

last_round as (
    select run_id, max(round) as last_round from rounds group by run_id
),

per_signal as (
    select
        s.run_id,
        s.round,
        s.signal_type,
        e.signal_id is not null as explored,
        coalesce(a.n, 0) as yielded,
        exists(
            select 1
            from signals as later
            where later.run_id = s.run_id and later.round > s.round and later.signal_type = s.signal_type
                and later.target = s.target
        ) as recurred,
        exists(
            select 1
            from solved
            where solved.run_id = s.run_id and solved.round > s.round and solved.task_id = s.task_id
        ) as solved_later,
        coalesce(l.last_round, s.round) - s.round as later_rounds
    from signals as s
    left join explored as e on e.run_id = s.run_id and e.round = s.round and e.signal_id = s.signal_id
    left join accepted as a on a.run_id = s.run_id and a.round = s.round and a.signal_id = s.signal_id
    left join last_round as l on l.run_id = s.run_id
),

final as (
    select
        run_id,
        round,
        signal_type,
        count(*) as signals,
        count_if(explored)::bigint as explored,
        sum(yielded)::bigint as yielded_tasks,
        count_if(recurred)::bigint as recurred,
        count_if(solved_later)::bigint as solved_later,
        count_if(solved_later and not recurred)::bigint as resolved,
        max(later_rounds) as later_rounds
    from per_signal
    group by run_id, round, signal_type
)

select * from final
order by run_id, round, signal_type
