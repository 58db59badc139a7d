"""Sessions: the session model, the store interface and its in-memory and RocksDB implementations."""
