"""The reconciler's tables, their migrations, and :class:`ReconcileStore`."""
