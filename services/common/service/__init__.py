"""A service process: settings, profiles, server, ops routes, WebSocket channel, lifecycle."""
