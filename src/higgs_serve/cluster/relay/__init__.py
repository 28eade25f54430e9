"""The front end's data plane: the public HTTP/1.1 listener that checks each request, routes
speech to a replica and passes the rest to the control plane (listener.py), its parsing (llhttp),
the pooled upstream connections, and the WebSocket relay."""
