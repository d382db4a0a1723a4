"""The agents' front door: programs that speak to the world for the router (HTTP, MCP)."""
