"""Scale-out: several engine replicas behind one endpoint (one host, or Ray Serve)."""
