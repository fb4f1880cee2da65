"""Configuration, read when ``init_app`` runs or a command starts (never at import time):
the settings, the data-at-rest settings and the log output. No framework.
"""
