"""`voice-agent plan`: a capacity plan computed from measurement files, every figure traced.

inputs   the measurement files, read and validated, each with its provenance
figures  the traced figure: a number with the files and fields it came from
model    the plan's schema (what --json writes)
sessions, engines, memory, latency, sizing   the arithmetic, one concern each
build    `build_plan`: the measurements grouped per machine, the arithmetic put together
citations, render   the plan as markdown, footnoted; and as JSON
cli      `voice-agent plan` and `python -m services.plan`
"""
