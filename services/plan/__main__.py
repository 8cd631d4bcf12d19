"""`python -m services.plan ARGS`: the same as `voice-agent plan ARGS`."""

from services.plan.cli import main

main()
