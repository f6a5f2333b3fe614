"""Streams: streaming federated EM, one window of client data at a time."""
