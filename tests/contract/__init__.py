"""Contract tests: the API client against a Prism mock of Hyperswitch's patched OpenAPI spec."""

#: A sandbox secret key (Prism checks that ``api-key`` is present, not its value).
API_KEY = "snd_contract0123456789"
