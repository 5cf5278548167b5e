"""Who may connect and what they may do: credentials, SCRAM verifiers, permissions (no I/O)."""
