"""The store's errors, in a module of their own so that ``coevolve.store`` and the pool-commit
protocol it mixes in (``coevolve.pool_commit``) both raise them without importing each other."""


class StoreError(RuntimeError):
    """The store cannot be reached or holds something unexpected."""


class ConcurrentCommitError(StoreError):
    """Another writer committed first; re-read the latest pool version and retry."""


class CorruptPartError(StoreError):
    """A recorded table part is missing, of another size than recorded, or not Parquet; the
    message names the table and the file."""
