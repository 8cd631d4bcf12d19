"""Who may call: credentials, API keys, limits, the guard at every entry point, redaction."""
