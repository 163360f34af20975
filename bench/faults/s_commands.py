"""(filled below)."""
