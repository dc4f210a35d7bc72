-- signal_value: which signals pay: per signal type and round, the tasks it yielded and how the
-- policy's success on them, and on the held-out sets, moved afterwards.
-- Grain: one row per (run_id, round, signal_type) with a signal or a task of that type (fallback,
-- random and static contexts included: the baselines a signal must beat).
-- Definitions. The yielded tasks of (round r, type t) are the accepted candidates of round r
-- explored from a context of type t; partial counts those that passed pass 2 by failure with
-- positive reward (pass_kind). Success on them: at validation (round r's pass-2 attempts, phase
-- validate), then in training in the first later round that trained on them (next) and in the
-- latest round that did (last); change = last - validation. Held-out: the round's evaluation
-- (rounds.eval_score, the held-out benchmark scenarios; synth_score, the held-out synthesized
-- split) after round r and after the next round (whose pool first held round r's tasks);
-- the moves are the same for every type of a round (they share its pool).
-- Parameters: none.
-- Columns: run_id, round, signal_type, signals (mined), yielded_tasks, partial, success_validate,
--          success_next, success_last, success_change, eval_score, eval_next, eval_change,
--          synth_score, synth_next, synth_change.
with signals as (
    select run_id, round, signal_type, count(*) as n from signals group by all
),

yielded as (
    select
        run_id, round, signal_type, json_extract_string(spec, '$.task_id') as task_id,
        -- stores written before pass_kind existed: read it from the verdict's reason
        coalesce(pass_kind, case
            when reason like 'accepted: pass 2 failed%' then 'partial'
            when reason like 'accepted: pass 2 solved%' then 'success'
        end) as pass_kind
    from candidates
    where verdict = 'accepted'
),

episodes as (
    select run_id, round, phase, episode_id, task_id, bool_or(success) as success
    from rollouts
    where phase in ('validate', 'train') and task_id in (select task_id from yielded)
    group by all
),

task_rounds as (
    select
        y.run_id, y.round, y.signal_type, y.task_id, e.round as seen_round, e.phase,
        avg(e.success::double) as rate
    from yielded as y
    join episodes as e
        on e.run_id = y.run_id and e.task_id = y.task_id
        and ((e.phase = 'validate' and e.round = y.round) or (e.phase = 'train' and e.round > y.round))
    group by all
),

per_task as (
    select
        run_id, round, signal_type, task_id,
        avg(rate) filter (where phase = 'validate') as validate_rate,
        arg_min(rate, seen_round) filter (where phase = 'train') as next_rate,
        arg_max(rate, seen_round) filter (where phase = 'train') as last_rate
    from task_rounds
    group by all
),

per_type as (
    select
        y.run_id, y.round, y.signal_type,
        count(*) as yielded_tasks,
        count_if(y.pass_kind = 'partial')::bigint as partial,
        avg(p.validate_rate) as success_validate,
        avg(p.next_rate) as success_next,
        avg(p.last_rate) as success_last
    from yielded as y
    left join per_task as p using (run_id, round, signal_type, task_id)
    group by all
),

held as (
    select
        run_id, round, eval_score, synth_score,
        lead(eval_score) over (partition by run_id order by round) as eval_next,
        lead(synth_score) over (partition by run_id order by round) as synth_next
    from rounds
),

final as (
    select
        coalesce(s.run_id, t.run_id) as run_id,
        coalesce(s.round, t.round) as round,
        coalesce(s.signal_type, t.signal_type) as signal_type,
        coalesce(s.n, 0) as signals,
        coalesce(t.yielded_tasks, 0) as yielded_tasks,
        coalesce(t.partial, 0) as partial,
        round(t.success_validate, 4) as success_validate,
        round(t.success_next, 4) as success_next,
        round(t.success_last, 4) as success_last,
        round(t.success_last - t.success_validate, 4) as success_change,
        h.eval_score,
        h.eval_next,
        round(h.eval_next - h.eval_score, 4) as eval_change,
        h.synth_score,
        h.synth_next,
        round(h.synth_next - h.synth_score, 4) as synth_change
    from signals as s
    full outer join per_type as t using (run_id, round, signal_type)
    left join held as h
        on h.run_id = coalesce(s.run_id, t.run_id) and h.round = coalesce(s.round, t.round)
)

select * from final
order by run_id, round, signal_type
