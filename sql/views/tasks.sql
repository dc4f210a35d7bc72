-- tasks: one row per task of any pool version (seed or explored), partitioned by the round that created it. Current pool membership: pool_versions / the latest manifest.
-- Columns: see coevolve/schemas.py TASKS, plus `round` from the partition path.
-- Parameter: {{source}} is the list of task files that committed pool manifests list (Store.table_files),
-- filled in by coevolve.sql.connect: a crashed or losing commit's file is never read.
create or replace view tasks as
select * from read_parquet({{source}}, hive_partitioning = true, hive_types = {'round': integer}, union_by_name = true)
