"""``cliffguard data``: a streaming data-quality pass over a text corpus (see cliffguard/commands/data.py)."""
