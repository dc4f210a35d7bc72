"""coevolve: agents and their training data, evolving together."""
