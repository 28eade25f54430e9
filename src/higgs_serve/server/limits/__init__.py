"""What one request may hold and how long a reader may stall: body and JSON-shape limits, batch totals, the send timeout."""
