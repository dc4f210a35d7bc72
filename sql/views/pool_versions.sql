-- pool_versions: one row per committed pool version (version, parent, task_count, added, removed, manifest key).
-- Columns: see coevolve/schemas.py POOL_VERSIONS, plus `round` from the partition path.
-- Parameter: {{source}} is the list of the table's recorded part files (Store.table_files: only what the
-- part manifests record, each checked), filled in by coevolve.sql.connect.
create or replace view pool_versions as
select * from read_parquet({{source}}, hive_partitioning = true, hive_types = {'round': integer}, union_by_name = true)
