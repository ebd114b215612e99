"""What every part of sweep stands on: the errors a user sees, files written safely, YAML read
safely, placeholders, optional imports, the terminal, and the name of every attribute sweep
stores (`names`). Imports nothing of sweep."""
