"""`python -m services.loadtest ARGS`: the same as `voice-agent loadtest ARGS`."""

from services.loadtest.cli import main

raise SystemExit(main())
