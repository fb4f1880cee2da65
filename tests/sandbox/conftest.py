"""Fixtures of the sandbox processor tests (defined in :mod:`sandbox_support`)."""

from sandbox_support import (  # noqa: F401 (fixtures are found by name)
    api,
    hooked,
    hooked_api,
    server,
    session,
    sink,
    start_sandbox,
)
