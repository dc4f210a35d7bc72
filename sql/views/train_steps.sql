-- train_steps: one row per optimizer step of the local GRPO trainer (train.ppo_epochs rows per GRPO step).
-- Columns: see coevolve/schemas.py TRAIN_STEPS (run_id, step, epoch, loss, pg_loss, kl, clip_frac,
-- ratio_mean, grad_norm, reward_mean, reward_std, n_tokens, seconds, ...), plus `round` from the partition path.
-- Parameter: {{source}} is the list of the table's recorded part files (Store.table_files: only what the
-- part manifests record, each checked), filled in by coevolve.sql.connect.
create or replace view train_steps as
select * from read_parquet({{source}}, hive_partitioning = true, hive_types = {'round': integer}, union_by_name = true)
