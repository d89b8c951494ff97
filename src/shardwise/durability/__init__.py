"""What survives a crash, and its checks: journal, leases, sessions, verify, batch."""
