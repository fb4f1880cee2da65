"""Storage: the tables and their migrations, the SQL that differs per database, and every
statement hookledger runs (receive, claim, dispatch, operator actions and reads).
"""
