"""The privacy-budget ledger (SQLite and PostgreSQL)."""
