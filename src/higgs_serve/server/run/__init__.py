"""A request in flight: the steps an admitted request goes through, one generation's bookkeeping, and long-form inputs spoken as one response."""
