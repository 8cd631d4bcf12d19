"""The wire: typed client and server events, parsed once at the edge."""
