"""Persistent sessions replicated to other members, and taken over from a replica."""
