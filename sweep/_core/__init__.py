"""What every part of sweep stands on: the errors a user sees, files written safely, YAML read
safely, placeholders, optional imports, the terminal. Imports nothing of sweep."""
