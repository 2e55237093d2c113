"""The one way a number from the network becomes a Python number.

Headers (``Content-Length``, Discord's ``X-RateLimit-*`` and
``X-Signature-Timestamp``), body fields (Telegram's ``retry_after``,
Discord's ``retry_after``), a Redis or NATS value, a chat id a library
spelled as a string: each is outside input, and each is read here and
nowhere else.

Why not ``str.isdigit()`` and ``int()``/``float()``: they disagree, and
both accept more than ASCII.  ``"²".isdigit()`` is True and ``int("²")``
raises; ``int("١٢")`` is 12 (Arabic-Indic digits), ``float(" 1_0 ")`` is
10.0, ``float("nan")``, ``float("inf")`` and ``float("1e999")`` are floats;
an int of 100,000 digits takes quadratic time.  Here a number is ASCII
digits only (an optional ``-`` where a sign is allowed, one ``.`` for a
fraction), of bounded length, with optional surrounding spaces and tabs
(HTTP's optional whitespace).  Anything else is "not a number": each
function returns None (or the caller's ``default``) and never raises,
whatever it is given.
"""

import re
from typing import Any, Optional

__all__ = ["parse_int", "parse_seconds", "MAX_DIGITS"]

#: Digits a whole number from the network may have: 19 holds any int64.
MAX_DIGITS = 19

_INT = re.compile(r"[ \t]*(-?)([0-9]{1,%d})[ \t]*" % MAX_DIGITS, re.ASCII)
# At most 12 digits before the point (about 31,700 years of seconds) and
# 9 after it (nanoseconds): every such number is exact enough as a float.
_DECIMAL = re.compile(r"[ \t]*([0-9]{1,12})(?:\.([0-9]{1,9}))?[ \t]*", re.ASCII)


def parse_int(value: Any, *, signed: bool = False, max_digits: int = MAX_DIGITS,
              lo: Optional[int] = None, hi: Optional[int] = None) -> Optional[int]:
    """A whole number from the network, or None.

    ``value``: a ``str`` or ``bytes`` of ASCII digits (a leading ``-`` only
    when ``signed``; at most ``max_digits`` digits; spaces and tabs around
    are allowed), or a JSON int (not a bool).  The result must lie in
    ``[lo, hi]`` where given.
    """
    if isinstance(value, (bytes, bytearray)):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if isinstance(value, str):
        if len(value) > max_digits + 40:  # before the regex: bounded work
            return None
        m = _INT.fullmatch(value)
        if m is None or (m.group(1) and not signed) or len(m.group(2)) > max_digits:
            return None
        number = int(m.group(2))
        if m.group(1):
            number = -number
    elif isinstance(value, int) and not isinstance(value, bool):
        number = int(value)
        if number < 0 and not signed:
            return None
        if number.bit_length() > 64 * max(1, max_digits // 19):
            return None
    else:
        return None
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        return None
    return number


def parse_seconds(value: Any, default: Optional[float] = None, *,
                  cap: float = 86400.0) -> Optional[float]:
    """A non-negative number of seconds from the network as a float in
    ``[0, cap]`` (larger is ``cap``); ``default`` when it is not one.

    ``value``: a ``str``/``bytes`` of ASCII digits with an optional
    fraction (``"1"``, ``"0.250"``; no sign, exponent, ``inf`` or ``nan``),
    or a JSON number (an int, or a finite float >= 0).
    """
    if isinstance(value, (bytes, bytearray)):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return default
    if isinstance(value, str):
        if len(value) > 64:
            return default
        m = _DECIMAL.fullmatch(value)
        if m is None:
            return default
        seconds = float(m.group(0).strip())
    elif isinstance(value, bool):
        return default
    elif isinstance(value, int):
        if value < 0:
            return default
        return float(value) if value <= cap else float(cap)
    elif isinstance(value, float):
        if not value >= 0:  # negative or NaN
            return default
        seconds = value
    else:
        return default
    return seconds if seconds <= cap else float(cap)
