"""What is a secret, in one place: a variable whose name says so (a token, a key, a
password), a URL's password (`scheme://user:PASSWORD@host`), and a value that is a secret by
its form whatever its name (a GitHub or Slack token, a Slack webhook, a Sentry DSN, an AWS
access key id: formats `detect-secrets` knows). command.sh, env.json, a dry run's lines and
printed storage URLs leave such values out."""

from __future__ import annotations

import re

# names of variables (and URL query keys) whose values are left out; sweep's SWEEP_* are not
NAME = re.compile(r"pass|pwd|secret|token|key|credential|auth|cookie", re.IGNORECASE)
SHORTEST = 6  # shorter values of such variables are not looked for in the arguments
# a password in a URL: scheme://user:PASSWORD@host (group 1)
URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:([^\s/@]+)@")
# values that are secrets by their form
FORM = re.compile(
    r"\bgh[pousr]_[A-Za-z0-9]{30,}"  # GitHub tokens: ghp_ (classic), gho_ (OAuth), ...
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"  # GitHub fine-grained tokens
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"  # Slack tokens
    r"|https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9/_-]+"  # Slack webhooks
    r"|[A-Za-z][A-Za-z0-9+.-]*://[0-9a-fA-F]{16,}@[^\s/@]*sentry[^\s/@]*/\S*"  # Sentry DSNs
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key ids
)
STARS = "***"


def secret_name(name: str) -> bool:
    """Whether a variable's name says its value is a secret (a token, a key, a password)."""
    return (not name.startswith("SWEEP_") and name not in ("PWD", "OLDPWD")
            and bool(NAME.search(name)))


def holds_password(value: str) -> bool:
    """Whether `value` holds a URL with a password in it (`scheme://user:password@host`)."""
    return URL_PASSWORD.search(value) is not None


def secret_form(value: str) -> bool:
    """Whether `value` holds a secret by its form (a GitHub token, a Slack webhook, ...)."""
    return FORM.search(value) is not None


def secret_value(value: str) -> bool:
    """Whether `value`, whatever its variable's name, holds a URL's password or a secret by
    its form."""
    return holds_password(value) or secret_form(value)


def secret_variable(name: str, value: str) -> bool:
    """Whether a variable's value is left out: its name looks secret, or its value holds a
    URL's password or a secret by its form."""
    return secret_name(name) or secret_value(value)


def starred(text: str) -> str:
    """`text` with each URL's password and each secret by its form written as `***`."""
    text = URL_PASSWORD.sub(lambda m: m.group(0)[:m.start(1) - m.start(0)] + STARS + "@", text)
    return FORM.sub(STARS, text)
