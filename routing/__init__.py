"""Routing: the topic trie and (later) the cluster route table and forwarding."""
