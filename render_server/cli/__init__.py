"""The `render-server` command line: `main` builds the parser from one module per command."""
