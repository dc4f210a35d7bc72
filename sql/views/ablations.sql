-- ablations: one row per round of one ablation run (condition x seed); round 0 is the zero-shot evaluation.
-- Columns: see coevolve/schemas.py ABLATIONS, plus `round` from the partition path.
-- Parameter: {{source}} is the list of the table's recorded part files (Store.table_files: only what the
-- part manifests record, each checked), filled in by coevolve.sql.connect.
create or replace view ablations as
select * from read_parquet({{source}}, hive_partitioning = true, hive_types = {'round': integer}, union_by_name = true)
