"""Edges: processes that speak to the outside world and are clients of the router.

Each edge is a client of the router through the SDK, in its own process, never a
second router (docs/design.md, "Processes"): `relay mcp` (edges.mcp_server)
serves agents over the Model Context Protocol; `relay http` (edges.http) serves REST,
server-sent events and the live console.
"""
