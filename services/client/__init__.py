"""A client of the gateway's `/v1/stream`: `voice-agent client`, the load generator, tests."""
