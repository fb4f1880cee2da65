"""The public path of engines and migrations: re-exports :mod:`receiver.storage.database`, where
the code lives (see docs/architecture.md)."""

from receiver.storage.database import (
    DEFERRED_BEGIN_OPTION as DEFERRED_BEGIN_OPTION,
)
from receiver.storage.database import (
    MIGRATIONS_DIR as MIGRATIONS_DIR,
)
from receiver.storage.database import (
    PING_AFTER_IDLE as PING_AFTER_IDLE,
)
from receiver.storage.database import (
    RECEIVER_MIGRATIONS as RECEIVER_MIGRATIONS,
)
from receiver.storage.database import (
    VERSION_TABLE as VERSION_TABLE,
)
from receiver.storage.database import (
    MigrationTree as MigrationTree,
)
from receiver.storage.database import (
    check_schema as check_schema,
)
from receiver.storage.database import (
    current_revision as current_revision,
)
from receiver.storage.database import (
    deferred_begin as deferred_begin,
)
from receiver.storage.database import (
    downgrade as downgrade,
)
from receiver.storage.database import (
    head_revision as head_revision,
)
from receiver.storage.database import (
    is_sqlite as is_sqlite,
)
from receiver.storage.database import (
    make_engine as make_engine,
)
from receiver.storage.database import (
    normalise_url as normalise_url,
)
from receiver.storage.database import (
    run_migrations as run_migrations,
)
from receiver.storage.database import (
    upgrade as upgrade,
)

__all__ = [
    "MIGRATIONS_DIR",
    "VERSION_TABLE",
    "is_sqlite",
    "PING_AFTER_IDLE",
    "make_engine",
    "normalise_url",
    "MigrationTree",
    "RECEIVER_MIGRATIONS",
    "DEFERRED_BEGIN_OPTION",
    "deferred_begin",
    "run_migrations",
    "upgrade",
    "downgrade",
    "current_revision",
    "head_revision",
    "check_schema",
]
