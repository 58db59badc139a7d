"""Netsplits: partition detection, reconnection to lost members, healing."""
