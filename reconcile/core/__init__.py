"""The reconciler's pure core: the diff, the report, the errors, safe JSON decoding."""
