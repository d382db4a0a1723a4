"""The broker: policy (pure units) and the router process (broker/router/)."""

# The compiled units, when built and current (sdk/compiled.py), before any is imported.
from sdk.compiled import search_path

__path__ = search_path(__name__, __path__)
