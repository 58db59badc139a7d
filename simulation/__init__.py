"""Simulations in virtual time that combine layers: the SWIM cluster with partition
detection (`membership`) and `meshd simulate` (`cli`). Above every node package, so
it may use any of them; no node code imports it."""
