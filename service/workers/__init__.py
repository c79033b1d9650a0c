"""`textserve serve --workers N`: the supervisor, its worker processes, the typed messages
between them, how many workers fit, and the one /metrics over all of them."""
