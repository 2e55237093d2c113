"""How the outbox calls a sender: one function per sender, chosen once at open.

A stored reply is ``(method, params)`` plus the row's idempotency key, a
string that stays the same every time the row is sent, across restarts
(``"<file id>-<row id>"``, at most 25 characters).  Three kinds of senders:

- One with ``outbox_call(sc, method, params, *, key)``: the outbox hands it
  the key and it uses the platform's own idempotency field.  This is the
  protocol a new platform's sender implements.  Where the platform's key is
  not free-form, it belongs in ``params``, fixed when the reply is made:
  QQ deduplicates a passive reply by ``msg_id`` + ``msg_seq``, and
  ``msg_seq`` must be 1-5 per ``msg_id``, so the code that makes the reply
  puts the ``msg_seq`` it assigned into ``params`` before ``send``; the
  row replays it unchanged at every attempt and after a restart, and QQ
  answers a repeat "already delivered".
- ``DiscordSender``: ``method`` is ``"<HTTP verb> <path>"`` (``"POST
  /channels/123/messages"``); a Create Message gets ``nonce`` = the key and
  ``enforce_nonce: true`` unless ``params`` has a nonce, so Discord drops a
  resend of a message it already created (within its few-minute window).
- Anything with ``call(method, params, *, timeout)`` (``TelegramSender``):
  the Bot API has no idempotency key; a resend may duplicate.
"""

import re

__all__ = ["bind_sender"]

_CREATE_MESSAGE = re.compile(r"/channels/(\d{1,20})/messages\Z")


def _is_discord(sender):
    return any(cls.__name__ == "DiscordSender" and cls.__module__.startswith("fastdispatch.")
               for cls in type(sender).__mro__)


def _call_with_key(sender):
    def call(sc, method, params, key):
        return sender.outbox_call(sc, method, params, key=key)
    return call


def _call_plain(sender):
    def call(sc, method, params, key):
        return sender.call(method, params, timeout=sc.remaining())
    return call


def _call_discord(sender):
    def call(sc, method, params, key):
        verb, _, path = method.partition(" ")
        match = _CREATE_MESSAGE.match(path) if verb == "POST" else None
        resource = route = ""
        if match is not None:
            resource = match.group(1)
            route = "POST /channels/{channel.id}/messages"
            if "nonce" not in params:
                params["nonce"] = key
                params["enforce_nonce"] = True
        return sender.request(verb, path, json=params, sc=sc, resource=resource,
                              route=route, timeout=sc.remaining())
    return call


def _check_http_method(method):
    verb, _, path = method.partition(" ")
    if verb not in ("GET", "POST", "PUT", "PATCH", "DELETE") or not path.startswith("/"):
        raise ValueError("method must be '<HTTP verb> <path>' for a DiscordSender "
                         "(e.g. 'POST /channels/123/messages'), got %r" % (method,))


def _any_method(method):
    pass


def bind_sender(name, sender):
    """``(call, check)`` for ``sender``: ``call(sc, method, params, key)``
    sends; ``check(method)`` raises ValueError for a method it cannot take."""
    if callable(getattr(sender, "outbox_call", None)):
        return _call_with_key(sender), _any_method
    if _is_discord(sender):
        return _call_discord(sender), _check_http_method
    if callable(getattr(sender, "call", None)):
        return _call_plain(sender), _any_method
    raise TypeError("senders[%r] must have call(method, params, *, timeout) (TelegramSender) "
                    "or outbox_call(sc, method, params, *, key), or be a DiscordSender; got %r"
                    % (name, type(sender).__name__))
