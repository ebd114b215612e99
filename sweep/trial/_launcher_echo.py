"""What `accelerate launch` (1.16) adds to a trainer's stderr once the trainer has ended: a copy
of its tail (pure).

When the trainer exits non-zero, the launcher raises `CalledProcessError` `from
RuntimeError(<the last stderr it passed on>)`, so the log goes on with `RuntimeError: ` and that
copy (the last 512 KiB at most, cut where a read began, so possibly mid-line), a blank line,
"The above exception was the direct cause of the following exception:", and the launcher's
traceback. `echo_verdict` tells such a copy from the trainer's own lines; `launcher_echo` finds
where it begins. The fail reason (`outcome`) and the reports read from stderr
(`intermediate.OutputReader`) both end there.
"""

from __future__ import annotations

START = "RuntimeError: "  # the line the copy begins with
CAUSED = "The above exception was the direct cause of the following exception:"
MAX_COPY = 512 << 10  # bytes of the trainer's stderr the launcher keeps (accelerate 1.16)
_CUT = "\ufffd"  # the copy starts where a read began: a split character decodes as this


def echo_verdict(before: str, after: str) -> bool | None:
    """Whether `after` (text from a line that starts with START) is the launcher's copy of the
    end of `before` (what the log held before that line): True when the copy is whole and is
    so, False when it is not or cannot become so, None when more text may still make it one
    (its lines so far all appear in `before`, and "direct cause" has not come yet)."""
    if not after.startswith(START):
        return False
    body = after[len(START):]
    end = body.find("\n" + CAUSED)
    if end >= 0:
        copy = body[:end].rstrip("\n").lstrip(_CUT)
        return before.rstrip("\n").endswith(copy)
    whole = body[: body.rfind("\n") + 1].rstrip("\n").lstrip(_CUT)  # its complete lines
    if len(whole) > MAX_COPY or (whole and whole not in before):
        return False
    return None


def launcher_echo(text: str) -> int | None:
    """Where in `text` (a trainer's stderr as the launcher passed it on) the launcher's copy of
    its tail begins (the START line, see `echo_verdict`); None if `text` holds no whole copy."""
    at = len(text)
    while (at := text.rfind(START, 0, at)) >= 0:
        if (at == 0 or text[at - 1] == "\n") and echo_verdict(text[:at], text[at:]):
            return at
    return None
