"""Membership: SWIM + Lifeguard gossip, dissemination, transports, mDNS, simulator, traces."""
