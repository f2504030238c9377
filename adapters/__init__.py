"""Built-in adapters; each module names its class in ADAPTER."""
