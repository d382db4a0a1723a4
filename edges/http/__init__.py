"""The HTTP + SSE gateway and the live console (`relay http`), a client of the router."""
