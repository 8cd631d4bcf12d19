"""Entry points and operator tools: the `voice-agent` CLI, doctor, deploy rendering, models,
the Redis launcher. The top layer: it imports the services; nothing imports it."""
