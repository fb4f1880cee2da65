"""The ``reconcile`` command (entry point :func:`reconcile.cli.commands.main`)."""
