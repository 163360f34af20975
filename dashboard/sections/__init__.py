"""One module per dashboard section; each exposes ``render(ctx: Context)``."""
