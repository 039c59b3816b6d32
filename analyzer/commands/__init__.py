"""One module per command of `model-analyzer`: its typed Typer function and what it runs."""
