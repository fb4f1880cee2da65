"""The paths that feed missed transitions into the receiver's inbox: lists and sweep
(through :mod:`reconcile.recovery.recover`) and the events API.
"""
