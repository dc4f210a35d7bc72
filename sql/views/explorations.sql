-- explorations: one row per step of one exploration run (signal, context task, run, step, action, observation).
-- Columns: see coevolve/schemas.py EXPLORATIONS, plus `round` from the partition path.
-- Parameter: {{source}} is the list of the table's recorded part files (Store.table_files: only what the
-- part manifests record, each checked), filled in by coevolve.sql.connect.
create or replace view explorations as
select * from read_parquet({{source}}, hive_partitioning = true, hive_types = {'round': integer}, union_by_name = true)
