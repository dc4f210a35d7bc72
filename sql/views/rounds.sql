-- rounds: one row per finished round: pool size, signal counts, pass rate, evaluation score, stage timings (t_*).
-- Columns: see coevolve/schemas.py ROUNDS, plus `round` from the partition path.
-- Parameter: {{source}} is the list of the table's recorded part files (Store.table_files: only what the
-- part manifests record, each checked), filled in by coevolve.sql.connect.
create or replace view rounds as
select * from read_parquet({{source}}, hive_partitioning = true, hive_types = {'round': integer}, union_by_name = true)
