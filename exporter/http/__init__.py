"""The HTTP side: the app and its routes, the runbook pages, TLS and basic auth, and the server that runs them."""
