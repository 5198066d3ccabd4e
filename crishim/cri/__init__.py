"""gRPC servicers: thin adapters that validate, call a manager and build the reply."""
