"""The `relay` command line, split by concern.

main.py     the parser (every command and its options) and `main`, the console script
launch.py   commands that run in the foreground: router, writer, and the Spark jobs
group.py    the whole broker of a data directory: `relay up` (--detach), `relay down`
operator.py commands that talk to a running broker through the SDK
auth.py     `relay auth`: editing auth.json
edges.py    commands that run an edge process: `relay mcp`
output.py   what operator commands print: tables for people, JSON with `--json`
"""
