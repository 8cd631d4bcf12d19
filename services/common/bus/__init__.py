"""The Redis bus: connection, durable writes, key names, job streams, messages, the worker."""
