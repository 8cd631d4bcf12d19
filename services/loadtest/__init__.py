"""`voice-agent loadtest`: concurrent simulated users against the gateway's /v1/stream.

corpus     what the users say: espeak-ng sentences made on the spot, or a folder of wavs
contract   one conversation as the client saw it, checked against the wire contract
stats      per-turn stage latencies from a checked conversation, and their statistics
user       one simulated user: speaks, listens to the agent (or talks over it), thinks
level      one concurrency level's figures, merged over workers, as a LEVEL report
capacity   the most sessions whose voice-to-voice p95 stays within a budget, no turn lost
breakdown  where voice-to-voice went: the services' histograms, differenced per level
workers    a level's sessions run in this process or spread over worker processes
server     what the services say about themselves (/health, /metrics) during a level
progress   the live progress line on stderr
plots      PNG plots of a results file (matplotlib, imported only when asked for)
cli        `voice-agent loadtest` and `python -m services.loadtest`
"""
