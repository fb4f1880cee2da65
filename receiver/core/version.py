"""hookledger's version: the distribution's (``hookledger --version``, the API client's
User-Agent). Read by the build from this file, so it stays one literal."""

__version__ = "0.1.0.dev0"
