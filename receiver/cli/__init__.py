"""The ``hookledger`` command (entry point :func:`receiver.cli.commands.main`)."""
