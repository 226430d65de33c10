"""Foundations every stage shares: the record schema, the tables between stages, config, errors, names, layout math."""
