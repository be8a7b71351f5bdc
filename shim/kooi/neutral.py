"""Control characters made visible: what kooi prints from others (a workload's output,
an engine's answer, a file's name) never acts on the terminal or a log reader. A
module of its own, with no imports: every `kooi` command's output passes through it
(cli.exits.Neutral).
"""

from __future__ import annotations

# Control characters in the workload's output are shown, not obeyed: no escape sequence
# of the workload's rewrites the terminal (hiding kooi's own lines) or a log reader's.
# Tab and newline pass; C0, DEL, C1 and the bidirectional overrides become \xNN/\uNNNN.
_NEUTRAL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0))}
# Also the line and paragraph separators (a line of the workload's that a reader takes
# for kooi's own) and the zero-width characters that hide text.
_NEUTRAL.update({c: f"\\u{c:04x}" for c in (0x061c, 0x200b, 0x200e, 0x200f, 0x2028, 0x2029,
                                           *range(0x202a, 0x202f), *range(0x2066, 0x206a), 0xfeff)})


def neutral(text: str) -> str:
    """TEXT with its control characters made visible (tab and newline kept)."""
    return text.translate(_NEUTRAL)


def one_line(text: str) -> str:
    """TEXT neutral, and one line (a newline as \\n): an item of a list, whose name
    could otherwise print a line of its own (review 28: a file name in `kooi gc`'s)."""
    return neutral(text).replace("\n", "\\n")
