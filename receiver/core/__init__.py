"""The pure core: signatures, typed events, statuses, the transition model and guard,
object shapes, unified codes, masking and the data-key cipher. No I/O, and no Flask,
SQLAlchemy or requests (an import-linter contract and a test keep it so).
"""
