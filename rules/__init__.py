"""The rule engine: SQL rules over messages and events, compiled once, with actions."""
