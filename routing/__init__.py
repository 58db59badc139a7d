"""Routing: the topic trie, the cluster route table and forwarding.

The trie and the route table may be compiled with mypyc (`native` chooses at import).
"""

import native

native.add_compiled(__path__)
