"""The public path of living beside Flask-Migrate: re-exports :mod:`receiver.storage.autogenerate`,
where the code lives (see docs/architecture.md)."""

from receiver.storage.autogenerate import (
    TABLE_PREFIX as TABLE_PREFIX,
)
from receiver.storage.autogenerate import (
    IncludeName as IncludeName,
)
from receiver.storage.autogenerate import (
    IncludeObject as IncludeObject,
)
from receiver.storage.autogenerate import (
    chain_include_name as chain_include_name,
)
from receiver.storage.autogenerate import (
    chain_include_object as chain_include_object,
)
from receiver.storage.autogenerate import (
    include_name as include_name,
)
from receiver.storage.autogenerate import (
    include_object as include_object,
)
from receiver.storage.autogenerate import (
    is_hookledger_table as is_hookledger_table,
)

__all__ = [
    "TABLE_PREFIX",
    "chain_include_name",
    "chain_include_object",
    "include_name",
    "include_object",
    "is_hookledger_table",
    "IncludeName",
    "IncludeObject",
]
