"""pyTelegramBotAPI (the threaded ``TeleBot``): :class:`DispatcherRequestSender`,
a request sender for ``telebot.apihelper.CUSTOM_REQUEST_SENDER`` that sends
every Bot API request through an :class:`~fastdispatch.OutboundDispatcher`
(SPEC §8.1).

pyTelegramBotAPI's documented hook on the way out is
``apihelper.CUSTOM_REQUEST_SENDER``: a callable used instead of
``requests.request``, called as ``sender(method, url, params=...,
files=..., timeout=..., proxies=...)``, whose answer (a
``requests.Response``) the library then checks itself, raising its
``ApiTelegramException`` for an error.  Here:

- a request whose ``params`` have a ``chat_id`` is submitted to the
  dispatcher under that chat and the calling thread (a ``TeleBot`` worker
  running a handler) waits for it, as it waits for ``requests``: the
  request is sent on a dispatcher worker, in the chat's order, one at a
  time, paced by the dispatcher's ``Pacing``;
- one without (``getMe``, ``answerCallbackQuery``, ...) goes through the
  dispatcher under a key of its own: only the bot-wide limit applies;
- ``getUpdates`` is sent at once, on the calling thread;
- an answer ``429`` becomes fastdispatch's ``RetryAfter`` of that chat
  (bot-wide for a request without a chat), its ``parameters.retry_after``
  read from the body: the chat waits, others go on, and the request is sent
  again before the chat's later ones, as the dispatcher's ``RetryPolicy``
  allows.  When no attempt is left, the last 429 answer is returned, so the
  bot gets the library's own ``ApiTelegramException`` (``error_code``
  429); every other answer and every error of ``requests`` reach it as
  they would without the sender.

The hook is process-wide (a module attribute of ``apihelper``): every
``TeleBot`` of the process sends through the one sender.  Each dispatcher
worker keeps its own ``requests.Session`` (a ``Session`` is not meant to be
shared by threads), as ``apihelper`` keeps one per thread.  The sender owns
nothing: the dispatcher is the caller's, who shuts it down.
"""

import concurrent.futures
import json
import threading
from typing import Any, Callable, Optional

from .._errors import Cancelled, RetryAfter
from ._common import UNPACED_METHODS, chat_key, no_chat_key, retry_after

__all__ = ["DispatcherRequestSender"]


class _Flood429(RetryAfter):
    """A 429 answer, as the dispatcher's ``RetryAfter``, keeping the answer
    to hand back when no attempt is left."""

    def __init__(self, seconds, scope, response):
        super().__init__(seconds, scope)
        self.response = response


def _retry_after_of(response):
    try:
        body = json.loads(response.text)
        return (body.get("parameters") or {}).get("retry_after")
    except (ValueError, AttributeError, TypeError):
        return None


class DispatcherRequestSender:
    """``apihelper.CUSTOM_REQUEST_SENDER = DispatcherRequestSender(dispatcher)``.

    ``send`` (default: ``requests``, one ``Session`` per thread) is what
    makes the HTTP request: ``send(method, url, **kwargs) ->
    requests.Response``, the signature of ``requests.request``.

    Costs: one dispatcher task per request; the calling thread waits for it
    (the threaded ``TeleBot``'s model), the request runs on a worker.
    """

    def __init__(self, dispatcher: Any,
                 send: Optional[Callable[..., Any]] = None) -> None:
        if not callable(getattr(dispatcher, "submit", None)):
            raise TypeError("dispatcher must be an OutboundDispatcher, got %r"
                            % (type(dispatcher).__name__,))
        if send is not None and not callable(send):
            raise TypeError("send must be callable")
        self.dispatcher = dispatcher
        self._send = send if send is not None else self._requests_send
        self._local = threading.local()  # .session: this thread's requests.Session

    def _requests_send(self, method, url, **kwargs):
        session = getattr(self._local, "session", None)
        if session is None:
            import requests

            session = self._local.session = requests.Session()
        return session.request(method, url, **kwargs)

    def submit(self, method: str, url: str, **kwargs: Any) -> "concurrent.futures.Future[Any]":
        """Queue the request; the Future holds the answer (after the last
        429, that 429) or the error of ``send``.  ``getUpdates`` is sent
        here and now."""
        name = url.rsplit("/", 1)[-1]
        if name.lower() in UNPACED_METHODS:
            done: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
            try:
                done.set_result(self._send(method, url, **kwargs))
            except BaseException as exc:
                done.set_exception(exc)
            return done
        params = kwargs.get("params") or {}
        key = chat_key(params.get("chat_id") if isinstance(params, dict) else None)
        has_chat = key is not None
        if not has_chat:
            key = no_chat_key(name)
        send = self._send

        def task(sc):
            response = send(method, url, **kwargs)
            if getattr(response, "status_code", None) == 429:
                wait = retry_after(_retry_after_of(response), has_chat)
                raise _Flood429(wait.seconds, wait.scope, response)
            return response

        inner = self.dispatcher.submit(key, task)
        outer: "concurrent.futures.Future[Any]" = concurrent.futures.Future()

        def settle(fut):
            if fut.cancelled():  # force_close() before it was sent
                outer.set_exception(Cancelled("the request was cancelled before it was sent"))
                return
            exc = fut.exception()
            if exc is None:
                outer.set_result(fut.result())
            elif isinstance(exc, _Flood429):
                outer.set_result(exc.response)  # the library raises its own 429 error
            else:
                outer.set_exception(exc)

        inner.add_done_callback(settle)
        return outer

    def __call__(self, method: str, url: str, **kwargs: Any) -> Any:
        """What ``apihelper`` calls instead of ``requests.request``."""
        return self.submit(method, url, **kwargs).result()
