"""Updates in: :func:`update_to_event`, :class:`TelegramPoller` (``getUpdates``
long polling on its own thread) and :func:`webhook_app` (a WSGI callable).

Both intakes turn updates into ``Event``s and hand them to
``Engine.handle_event``; neither lets a handler's exception end it.  Both
are at least once: an update is confirmed to Telegram (the poller's offset,
the webhook's 200) only once the engine took it, and the poller only once
its replies were sent or failed for good; an update the engine could not
take (its chat's reply queue is full, the engine is shutting down) is left
to Telegram, which delivers it again.
"""

import collections
import hmac
import json
import logging
import random
import re
import socket
import threading
from time import monotonic
from typing import Any, Dict, List, Optional

from .._drain import drain_engine
from .._errors import RetryAfter
from .._netnum import parse_int
from ..platform import ChatInfo, Event, SenderInfo
from ._sender import PlatformError, TelegramSender, _check_seconds, _display_name

__all__ = ["update_to_event", "TelegramPoller", "PollerError", "WebhookApp", "webhook_app"]

_log = logging.getLogger("fastdispatch.telegram")


def update_to_event(update: Any) -> Optional[Event]:
    """A ``message`` update with text -> an ``Event``; anything else
    (other update kinds, messages without text, malformed dicts) -> None.

    ``chat.id``, ``from.id`` and ``message_id`` become strings; a chat is a
    group when its type is ``group`` or ``supergroup``; ``raw`` is the whole
    update.
    """
    if not isinstance(update, dict):
        return None
    message = update.get("message")
    if not isinstance(message, dict):
        return None
    text, chat = message.get("text"), message.get("chat")
    if not isinstance(text, str) or not isinstance(chat, dict):
        return None
    chat_id = chat.get("id")
    if isinstance(chat_id, bool) or not isinstance(chat_id, (int, str)) or chat_id == "":
        return None
    chat_type = chat.get("type")
    title = chat.get("title")
    name = title if isinstance(title, str) and title else _display_name(chat)
    user: Dict[str, Any] = {}
    for key in ("from", "sender_chat"):
        if isinstance(message.get(key), dict):
            user = message[key]
            break
    user_id = user.get("id")
    user_title = user.get("title")
    sender = SenderInfo("" if isinstance(user_id, bool) or not isinstance(user_id, (int, str))
                        else str(user_id),
                        _display_name(user) or (user_title if isinstance(user_title, str) else ""))
    message_id = message.get("message_id")
    return Event(platform="telegram",
                 chat=ChatInfo(str(chat_id), is_group=chat_type in ("group", "supergroup"),
                               name=name),
                 sender=sender, text=text,
                 message_id="" if isinstance(message_id, bool) or not isinstance(
                     message_id, (int, str)) else str(message_id),
                 raw=update)


# -- handing an update to the engine ---------------------------------------------

# What became of an update offered to the engine (see _offer).
ACCEPTED = "accepted"  # the handlers ran and their replies were queued: answer it
IGNORED = "ignored"  # not a text message: nothing to do, answer it
BUSY = "busy"  # every reply was refused, the chat's queue is full: deliver it again later
CLOSED = "closed"  # the engine is shutting down: not handled, deliver it again later


def _offer(engine, sender, capabilities, update, event):
    """Hand one update (``event``: ``update_to_event(update)``) to the
    engine; return ``(kind, outcome)``.  Never raises (a hostile handler may
    raise anything, even a BaseException, and the intake goes on).

    ``outcome`` is the engine's :class:`~fastdispatch.engine.EventOutcome`
    (None for an engine without ``handle_event``, whose replies cannot be
    followed: such an update counts as settled at once).  An update is
    BUSY or CLOSED only when nothing of it went out (its handlers are done,
    no reply was queued, some were refused): running it again later sends
    no reply twice.
    """
    if event is None:
        return IGNORED, None
    handle = getattr(engine, "handle_event", None)
    try:
        if handle is None:
            engine.process_event(event, sender, capabilities)
            return ACCEPTED, None
        outcome = handle(event, sender, capabilities)
    except RuntimeError:
        if getattr(engine, "closed", False):
            return CLOSED, None
        _log.exception("processing update %r failed", update.get("update_id"))
        return ACCEPTED, None
    except BaseException:  # noqa: B902 - an intake thread must survive its handlers
        _log.exception("processing update %r failed", update.get("update_id"))
        return ACCEPTED, None
    if outcome.settled and outcome.queued == 0:
        refused = outcome.refused
        if refused["queue_full"]:
            return BUSY, outcome
        if refused["closed"]:
            return CLOSED, outcome
    return ACCEPTED, outcome


#: Replies pending (queued or running) across every chat beyond which the
#: intakes take no new update: about 7 KiB each in memory (one update from
#: each of 50,000 chats, replies held: +338 MiB without the bound, +66 MiB
#: with this one), and at Telegram's 30 messages/s 10,000 are more than
#: five minutes of sending.
DEFAULT_MAX_PENDING = 10_000


def _check_max_pending(max_pending):
    if max_pending is not None and (isinstance(max_pending, bool) or not isinstance(
            max_pending, int) or max_pending < 1):
        raise ValueError("max_pending must be a positive int or None, got %r" % (max_pending,))
    return max_pending


class _Room:
    """Whether a chat's reply queue has room for one more update's replies,
    and the bot room for more replies pending at all, so that an intake
    holds an update back *before* its handlers run rather than lose the
    replies that do not fit, or pile them up in memory.

    Bot-wide: at most ``max_pending`` replies queued or running across
    every chat (the dispatcher's cheap ``_pending_count()``); a flood of
    updates from many chats is then left to Telegram, which keeps it.

    The room needed is the most replies one update has made so far; the
    queue's capacity is the dispatcher's ``queue_size`` where it says it,
    else what ``queue_len`` read when a reply was refused (``QueueFull``
    means the queue was at capacity).  Until then every chat has room.
    Written by intake threads without a lock: each field is one int, and a
    stale read only makes one decision a little early or late.
    """

    def __init__(self, engine, max_pending=None):
        dispatcher = getattr(engine, "dispatcher", None)
        self._queue_len = getattr(dispatcher, "queue_len", None)
        self._pending_count = getattr(dispatcher, "_pending_count", None)
        self.max_pending = max_pending
        capacity = getattr(dispatcher, "queue_size", None)
        self.known = isinstance(capacity, int) and not isinstance(capacity, bool)
        self.capacity = capacity if self.known else None
        self.per_update = 1

    def available(self, chat_id):
        capacity, queue_len = self.capacity, self._queue_len
        if capacity is None or queue_len is None:
            return True
        try:
            return queue_len(chat_id) + min(self.per_update, capacity) <= capacity
        except Exception:  # a dispatcher of the caller's: no room check then
            return True

    def bot_full(self):
        """True when one more update's replies would take the replies
        pending across every chat past ``max_pending``."""
        count = self._pending_count
        if self.max_pending is None or count is None:
            return False
        try:
            return count() + self.per_update > self.max_pending
        except Exception:  # a dispatcher of the caller's: no bound then
            return False

    def learn_refusal(self, chat_id):
        if self.known or self._queue_len is None:
            return
        try:
            seen = self._queue_len(chat_id)
        except Exception:
            return
        if seen > 0 and (self.capacity is None or seen > self.capacity):
            self.capacity = seen

    def learn(self, outcome):
        made = outcome.queued + outcome.refused["queue_full"]
        if made > self.per_update:
            self.per_update = made


def _report_lost(update_id, outcome):
    """Log, once per update, the replies of an accepted update that were
    refused (the update is answered, so they are lost).  Returns their number."""
    lost = outcome.refused_total
    if lost:
        _log.warning("update %s (chat %r): %d of its %d replies were refused (%s) and are "
                     "lost", update_id, outcome.event.chat.id, lost, lost + outcome.queued,
                     ", ".join("%s %d" % (k, v) for k, v in outcome.refused.items() if v))
    return lost


def _wait_cap(seconds):
    # Every wait the intake computes is finite and below what the lock
    # primitives accept, whatever a server sent or a caller configured.
    return min(max(0.0, seconds), threading.TIMEOUT_MAX, 86400.0)


def _check_wait(name, value):
    value = _check_seconds(name, value)
    if value > 86400:
        raise ValueError("%s must be at most 86400 seconds (a day), got %r" % (name, value))
    return value


class PollerError(Exception):
    """Why a :class:`TelegramPoller` stopped by itself (``poller.error``):
    ``409 Conflict`` (a webhook is set, or another process polls with the
    same token) or an error it cannot go on after.  ``cause`` is the error
    the server answered (a :class:`PlatformError`) or None."""

    def __init__(self, message, cause=None):
        super().__init__(message)
        self.cause = cause


class TelegramPoller:
    """``getUpdates`` long polling on a thread of its own, at least once.

    ``TelegramPoller(sender, engine, poll_timeout=30, *, limit=100,
    offset=None, allowed_updates=None, backoff=0.5, max_backoff=30.0,
    max_retry_after=120.0, on_conflict="stop", recheck=0.25, idle_pause=1.0,
    max_pending=10_000)``

    **Offsets, at least once.**  ``getUpdates(offset=N)`` tells Telegram to
    forget every update below N, so the poller sends, as :attr:`offset`,
    the lowest update that is not *settled* yet: its handlers ran and every
    reply they queued was sent or failed for good (the engine's
    ``handle_event`` follows them).  An update whose replies are still
    queued is not confirmed: if the process dies (even by SIGKILL), the next
    one gets it again.  The price is a window: Telegram returns the
    ``limit`` (100) updates from the offset on, so at most that many
    updates are in hand at once, and after a crash at most that many are
    handled a second time.  While updates wait for their replies the poller
    asks again every ``recheck`` seconds (or as soon as the oldest settles)
    instead of long polling.  Updates are handled one at a time, in order;
    one the engine refuses whole (every reply refused: its chat's queue is
    full) is run again once the chat has room, which holds back the
    updates after it (back-pressure to Telegram, which keeps them); so is
    every update while ``max_pending`` replies are queued or running across
    all chats (None: no bot-wide bound): the offset stays, Telegram keeps
    the rest of a flood.
    :meth:`stop` confirms what is settled by then, :meth:`confirm` (after
    ``engine.shutdown()``) what settled since; ``run_polling`` does both.
    Pass ``offset=`` to resume from a stored value.  A ``getUpdates`` that
    brings nothing new, with nothing in hand, is followed by the next one no
    sooner than ``idle_pause`` seconds after it was sent: a server that
    does not hold long polls (or ``poll_timeout=0``) is asked about once a
    second, not thousands of times.

    **Errors.**  Network errors, 5xx and other failures back off
    exponentially (``backoff`` x 2^n, capped at ``max_backoff``, with
    jitter); a 429 waits its ``retry_after``, at most ``max_retry_after``
    (a server that asks for hours does not freeze the bot: the wait is cut
    and logged); a handler that raises is logged and the loop goes on.
    ``409 Conflict`` (a webhook is set, or another poller uses the token)
    ends the loop with :attr:`error` set and an error logged; with
    ``on_conflict="delete_webhook"`` the poller deletes the webhook once and
    goes on.  The thread never dies silently: anything unexpected is logged
    with its traceback, and the loop goes on (or, for a ``BaseException``,
    ends with :attr:`error` set).
    """

    def __init__(self, sender: TelegramSender, engine: Any, poll_timeout: float = 30, *,
                 limit: int = 100, offset: Optional[int] = None,
                 allowed_updates: Optional[List[str]] = None,
                 backoff: float = 0.5, max_backoff: float = 30.0,
                 max_retry_after: float = 120.0, on_conflict: str = "stop",
                 recheck: float = 0.25, idle_pause: float = 1.0,
                 max_pending: Optional[int] = DEFAULT_MAX_PENDING) -> None:
        if not isinstance(sender, TelegramSender):
            raise TypeError("sender must be a TelegramSender")
        if not callable(getattr(engine, "process_event", None)):
            raise TypeError("engine must have a process_event(event, sender, capabilities) "
                            "method")
        if isinstance(poll_timeout, bool) or not isinstance(poll_timeout, (int, float)) or not (
                0 <= poll_timeout <= 3600):
            raise ValueError("poll_timeout must be a number of seconds in [0, 3600]")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            raise ValueError("limit must be an int in [1, 100]")
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)):
            raise TypeError("offset must be an int or None")
        if on_conflict not in ("stop", "delete_webhook"):
            raise ValueError("on_conflict must be 'stop' or 'delete_webhook', got %r"
                             % (on_conflict,))
        self.sender = sender
        self.engine = engine
        self.poll_timeout = int(poll_timeout)
        self.limit = limit
        self.allowed_updates = list(allowed_updates) if allowed_updates is not None else None
        self.backoff = _check_wait("backoff", backoff)
        self.max_backoff = _check_wait("max_backoff", max_backoff)
        self.max_retry_after = _check_wait("max_retry_after", max_retry_after)
        self.recheck = _check_wait("recheck", recheck)
        self.idle_pause = _check_wait("idle_pause", idle_pause)
        self.on_conflict = on_conflict
        self._capabilities = sender.capabilities()
        self._room = _Room(engine, _check_max_pending(max_pending))
        self._lock = threading.Lock()  # guards _conn and _thread
        self._conn: Any = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        # What is in hand.  _settle_lock guards _start, _last, _unsettled,
        # _frozen and lost_replies; _settled is a Condition on it, notified
        # when an update in hand settles (the offset may move) and by stop().
        self._settle_lock = threading.Lock()
        self._settled = threading.Condition(self._settle_lock)
        self._start = offset  # the offset to send while nothing is in hand
        self._last: Optional[int] = None  # highest update_id handled
        self._unsettled: Dict[int, Any] = {}  # update_id -> EventOutcome, handled, not settled
        self._frozen = False
        self._confirmed = offset
        self.error: Optional[BaseException] = None  # why the loop ended by itself
        self.handled = 0  # updates given to the engine
        self.ignored = 0  # updates that were not text messages
        self.errors = 0  # failed getUpdates calls
        self.busy = 0  # times an update was held back because its chat's queue was full
        self.lost_replies = 0  # replies of answered updates that were refused

    def __repr__(self) -> str:
        return "TelegramPoller(%r, offset=%r, running=%r)" % (
            self.sender, self.offset, self.running)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def offset(self) -> Optional[int]:
        """The offset the next ``getUpdates`` sends: every update below it is
        settled (and confirmed by that call); None before the first update."""
        with self._settle_lock:
            return self._offset_locked()

    def _offset_locked(self):
        if self._unsettled:
            return min(self._unsettled)
        if self._last is not None:
            return self._last + 1
        return self._start

    @property
    def pending(self) -> int:
        """Updates handled whose replies are not all sent or failed yet."""
        with self._settle_lock:
            return len(self._unsettled)

    def start(self) -> "TelegramPoller":
        """Start polling on a daemon thread (again after :meth:`stop`)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError("the poller is already running")
            self._stop.clear()
            self.error = None
            thread = threading.Thread(target=self._run, name="fastdispatch-telegram-poller",
                                      daemon=True)
            self._thread = thread
            thread.start()
        return self

    def stop(self, timeout: Optional[float] = None) -> bool:
        """End the loop: the long poll in progress is cut (its connection is
        shut down), the update being handled finishes, the settled ones are
        confirmed.  Returns True once the loop has ended, False if it was
        still running after ``timeout`` seconds (a handler still busy), or
        at once when called from a handler (the poller's own thread): the
        loop then ends after that update.  Updates whose replies are still
        queued are confirmed by :meth:`confirm`, once they settle."""
        self._stop.set()
        with self._settled:
            self._settled.notify_all()
        with self._lock:
            conn, thread = self._conn, self._thread
        if thread is threading.current_thread():
            return False  # called by a handler: the loop ends after this update
        if conn is not None:
            sock = getattr(conn, "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def freeze(self) -> int:
        """Keep every update not settled by now unconfirmed, whatever becomes
        of its replies later (for a shutdown that gives up on them at its
        deadline: the next process gets those updates again).  Returns how
        many updates that is."""
        with self._settle_lock:
            self._frozen = True
            return len(self._unsettled)

    def confirm(self, timeout: float = 2.0) -> bool:
        """Confirm the settled updates now (one ``getUpdates(offset,
        timeout=0)``), once the loop has ended; True when Telegram knows of
        every settled update.  While the loop runs, its own next call does it."""
        if self.running and self._thread is not threading.current_thread():
            return False
        with self._settle_lock:
            offset = self._offset_locked()
        if offset is None or offset == self._confirmed:
            return True
        conn = None
        try:
            conn = self.sender._connect(timeout)
            self.sender._call_on(conn, "getUpdates", {"offset": offset, "limit": 1,
                                                      "timeout": 0}, timeout)
            self._confirmed = offset
            return True
        except Exception as exc:
            _log.warning("could not confirm handled updates up to %d (%s); they may be "
                         "delivered again", offset - 1, exc)
            return False
        finally:
            if conn is not None:
                conn.close()

    def _shutdown_counts(self):
        # drain_engine's report: (handled, lost, unconfirmed).
        return self.handled, self.lost_replies, self.pending

    def __enter__(self) -> "TelegramPoller":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _wait(self, seconds):
        return self._stop.wait(_wait_cap(seconds))

    def _fetch(self, offset):
        params = {"timeout": self.poll_timeout, "limit": self.limit}
        if offset is not None:
            params["offset"] = offset
        with self._settle_lock:
            if self._unsettled:
                params["timeout"] = 0  # updates are in hand: do not hold the line
        if self.allowed_updates is not None:
            params["allowed_updates"] = self.allowed_updates
        with self._lock:
            conn = self._conn
            if conn is None:
                conn = self._conn = self.sender._connect(self.sender.connect_timeout)
        try:
            result = self.sender._call_on(conn, "getUpdates", params,
                                          params["timeout"] + self.sender.connect_timeout)
        except BaseException:
            self._drop_connection()
            raise
        if offset is not None:
            self._confirmed = offset
        if not isinstance(result, list):
            raise PlatformError(200, "getUpdates answered %s, not a list"
                                % type(result).__name__, None, "getUpdates")
        return result

    def _drop_connection(self):
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken
                pass

    def _run(self):
        failures = 0
        deleted_webhook = False
        try:
            while not self._stop.is_set():
                try:
                    offset = self.offset
                    asked = monotonic()
                    try:
                        updates = self._fetch(offset)
                    except RetryAfter as exc:
                        self.errors += 1
                        seconds = exc.seconds
                        if seconds > self.max_retry_after:
                            _log.warning("getUpdates: %s; waiting max_retry_after=%g s instead",
                                         exc, self.max_retry_after)
                            seconds = self.max_retry_after
                        else:
                            _log.warning("getUpdates: %s", exc)
                        self._wait(seconds)
                        continue
                    except PlatformError as exc:
                        if exc.status != 409:
                            raise
                        self.errors += 1
                        if self.on_conflict == "delete_webhook" and not deleted_webhook \
                                and "webhook" in str(exc.description).lower():
                            _log.warning("getUpdates: a webhook is set; deleting it "
                                         "(on_conflict='delete_webhook')")
                            deleted_webhook = True
                            self.sender.call("deleteWebhook", {"drop_pending_updates": False})
                            continue
                        self.error = PollerError(
                            "getUpdates answered 409 Conflict (%s): %s" % (
                                exc.description,
                                "delete the webhook first (deleteWebhook, or "
                                "on_conflict='delete_webhook')" if "webhook" in
                                str(exc.description).lower() else
                                "another process is polling with this bot token"), exc)
                        _log.error("TelegramPoller stopped: %s", self.error)
                        return
                    failures = 0
                    if not self._handle_batch(updates):
                        if self.pending:
                            self._wait_for_settlement(len(updates) >= self.limit)
                        else:  # the server did not hold the line: do not spin
                            self._wait(self.idle_pause - (monotonic() - asked))
                except Exception as exc:
                    if self._stop.is_set():
                        break
                    self.errors += 1
                    failures += 1
                    delay = min(self.max_backoff, self.backoff * 2 ** min(failures - 1, 30))
                    delay *= random.uniform(0.5, 1.0)
                    if isinstance(exc, (PlatformError, ConnectionError, RetryAfter)):
                        _log.warning("getUpdates failed (%s); retrying in %.1f s", exc, delay)
                    else:  # not a server's answer: a bug somewhere, show where
                        _log.exception("TelegramPoller: unexpected error; retrying in %.1f s",
                                       delay)
                    self._wait(delay)
        except BaseException as exc:  # noqa: B902 - never die silently
            self.error = exc
            _log.critical("TelegramPoller stopped by %r", exc, exc_info=True)
        finally:
            self._drop_connection()
            self.confirm()

    def _handle_batch(self, updates):
        """Handle the updates not seen before; False if there were none."""
        new = False
        for update in updates:
            if self._stop.is_set():
                break  # not handled: not confirmed, so it comes again
            update_id = update.get("update_id") if isinstance(update, dict) else None
            if isinstance(update_id, bool) or not isinstance(update_id, int):
                _log.warning("getUpdates returned an update without update_id; ignored")
                continue
            with self._settle_lock:
                last, start = self._last, self._start
            if (last is not None and update_id <= last) or (
                    last is None and start is not None and update_id < start):
                continue  # in hand already, or confirmed before
            new = True
            if not self._handle(update_id, update):
                break
        return new

    def _handle(self, update_id, update):
        """Offer one update until the engine takes it; False if it did not
        (stopping, or the engine shut down: it comes again)."""
        event = update_to_event(update)
        room = self._room
        while True:
            if event is not None and room.bot_full():
                self.busy += 1
                if not self._wait_for_bot_room():
                    return False
            if event is not None and not room.available(event.chat.id):
                self.busy += 1
                if not self._wait_for_room(event.chat.id):
                    return False
            kind, outcome = _offer(self.engine, self.sender, self._capabilities, update, event)
            if outcome is not None:
                room.learn(outcome)
                if outcome.refused["queue_full"]:
                    room.learn_refusal(event.chat.id)
            if kind != BUSY:
                break
            self.busy += 1
            if not self._wait_for_room(event.chat.id):
                return False
        if kind == CLOSED:
            _log.info("update %d not handled: the engine is shutting down", update_id)
            self._stop.set()
            return False
        if kind == IGNORED:
            self.ignored += 1
        else:
            self.handled += 1
        with self._settle_lock:
            self._last = update_id
            if outcome is not None and not outcome.settled:
                self._unsettled[update_id] = outcome
        if outcome is not None:
            outcome.add_done_callback(lambda o, uid=update_id: self._settle(uid, o))
        return True

    def _settle(self, update_id, outcome):
        # On a dispatcher worker, any of them: the counts change under the lock.
        self._room.learn(outcome)
        lost = _report_lost(update_id, outcome)
        with self._settled:
            self.lost_replies += lost
            if self._frozen or self._unsettled.pop(update_id, None) is None:
                return
            self._settled.notify_all()

    def _wait_for_room(self, chat_id):
        """Wait until the chat's queue has room (or stop); False on stop."""
        _log.debug("chat %r: its reply queue is full; holding its update back", chat_id)
        room = self._room
        queue_len = room._queue_len
        full = queue_len(chat_id) if queue_len is not None else 0
        while not self._wait(0.02):
            if room.available(chat_id) and (room.capacity is not None or queue_len is None
                                            or queue_len(chat_id) < full):
                return True
        return False

    def _wait_for_bot_room(self):
        """Wait until the replies pending across all chats leave room (or
        stop); False on stop.  The update in hand and those after it stay
        with Telegram meanwhile (the offset does not move)."""
        _log.info("%d replies pending across all chats (max_pending): holding updates back",
                  self._room.max_pending)
        while not self._wait(0.02):
            if not self._room.bot_full():
                return True
        return False

    def _wait_for_settlement(self, full_batch):
        """Nothing new came: wait for the oldest update in hand to settle
        (then its offset goes out), or ``recheck`` seconds for new updates
        (none can appear while the batch was full)."""
        with self._settled:
            if not self._unsettled or self._stop.is_set():
                return
            before = self._offset_locked()
            self._settled.wait_for(
                lambda: self._stop.is_set() or self._offset_locked() != before,
                None if full_batch else self.recheck)


# -- webhook ---------------------------------------------------------------------

_STATUS = {200: "200 OK", 400: "400 Bad Request", 403: "403 Forbidden",
           405: "405 Method Not Allowed", 411: "411 Length Required",
           413: "413 Payload Too Large", 429: "429 Too Many Requests",
           500: "500 Internal Server Error", 503: "503 Service Unavailable"}


class _RecentIds:
    """The update ids answered 200 lately, and those being handled now.

    Bounded both ways: an id is forgotten ``seconds`` after its answer, and
    beyond ``count`` ids the oldest go first.  Kept in an ``OrderedDict``
    (id -> time of the answer, oldest first), so adding, looking up and
    forgetting are O(1); about 140 bytes per id remembered (measured:
    ``docs/telegram.md``).  Not thread-safe: the app's lock guards it.
    """

    __slots__ = ("count", "seconds", "_done", "_busy")

    def __init__(self, count, seconds):
        self.count = count
        self.seconds = seconds
        self._done = collections.OrderedDict()
        self._busy = set()

    def __len__(self):
        return len(self._done)

    def begin(self, update_id, now):
        """"new" (and now being handled), "done" (answered 200 lately) or
        "busy" (another delivery of it is being handled right now)."""
        self._prune(now)
        if update_id in self._busy:
            return "busy"
        if update_id in self._done:
            return "done"
        self._busy.add(update_id)
        return "new"

    def end(self, update_id, answered, now):
        self._busy.discard(update_id)
        if answered and self.count and self.seconds:
            self._done[update_id] = now
            self._done.move_to_end(update_id)
            if len(self._done) > self.count:
                self._done.popitem(last=False)

    def _prune(self, now):
        done, horizon = self._done, now - self.seconds
        while done:
            update_id, at = next(iter(done.items()))
            if at > horizon:
                break
            del done[update_id]


class WebhookApp:
    """The WSGI callable made by :func:`webhook_app`.

    ``.stats`` counts answers by status, plus ``duplicates`` (re-deliveries
    answered 200 without running the update again), ``in_progress``
    (re-deliveries that came while the first delivery was still being
    handled: 503), ``handled``, ``ignored`` and ``lost_replies`` (replies of
    answered updates that were refused).  :meth:`close` makes it refuse new
    updates (503: Telegram keeps them and delivers them again);
    :meth:`shutdown` closes it, drains the engine and reports.
    """

    def __init__(self, engine, sender, secret_token, max_body, remember, remember_seconds,
                 max_pending=DEFAULT_MAX_PENDING):
        self.engine = engine
        self.sender = sender
        self._secret = None if secret_token is None else secret_token.encode("ascii")
        self.max_body = max_body
        self._capabilities = sender.capabilities() if hasattr(sender, "capabilities") else None
        self._room = _Room(engine, max_pending)
        self._lock = threading.Lock()  # guards stats, _recent, _closed
        self.stats = {200: 0, 400: 0, 403: 0, 405: 0, 411: 0, 413: 0, 429: 0, 500: 0, 503: 0,
                      "duplicates": 0, "in_progress": 0, "handled": 0, "ignored": 0,
                      "lost_replies": 0, "bot_busy": 0}
        self._recent = _RecentIds(remember, remember_seconds)
        self._closed = False

    def __repr__(self):
        return "<fastdispatch.telegram webhook app, secret %s%s>" % (
            "set" if self._secret is not None else "NOT set", ", closed" if self._closed else "")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """From now on, answer every update 503 without handling it (Telegram
        delivers it again: to this process if it comes back, or to the next)."""
        with self._lock:
            self._closed = True

    def shutdown(self, timeout: Optional[float] = 30.0) -> Any:
        """For a server this app runs in (a gunicorn ``worker_exit`` hook,
        waitress): :meth:`close`, then drain the engine for at most
        ``timeout`` seconds (what is left then is cancelled), log one line
        with the counts and return the :class:`ShutdownReport`
        (``.exit_code`` is non-zero if a reply was dropped)."""
        self.close()
        return drain_engine(self.engine, timeout, intake=self)

    def _shutdown_counts(self):
        # drain_engine's report: (handled, lost, unconfirmed).
        with self._lock:
            return self.stats["handled"], self.stats["lost_replies"], 0

    def __call__(self, environ, start_response):
        try:
            status = self._handle(environ)
        except Exception:  # never into the server
            _log.exception("webhook: unexpected error")
            status = 500
        with self._lock:
            self.stats[status] = self.stats.get(status, 0) + 1
        body = b"" if status == 200 else _STATUS[status].encode() + b"\n"
        headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
        if status == 405:
            headers.append(("Allow", "POST"))
        elif status in (429, 503):
            headers.append(("Retry-After", "1"))
        start_response(_STATUS[status], headers)
        return [body]

    def _handle(self, environ):
        if environ.get("REQUEST_METHOD") != "POST":
            return 405
        if self._secret is not None:
            given = environ.get("HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN", "")
            if not isinstance(given, str) or not hmac.compare_digest(
                    given.encode("latin-1", "replace"), self._secret):
                return 403
        if self._closed:
            return 503  # before reading the body: nothing of it is kept
        length = environ.get("CONTENT_LENGTH") or ""
        stream = environ.get("wsgi.input")
        if stream is None:
            return 400
        if length.strip():
            length = parse_int(length)
            if length is None:
                return 400
            if length > self.max_body:
                return 413
            body = stream.read(length)
        elif environ.get("wsgi.input_terminated"):
            body = stream.read(self.max_body + 1)
            if len(body) > self.max_body:
                return 413
        else:
            return 411
        try:
            update = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested past the stack
            return 400
        if not isinstance(update, dict):
            return 400
        update_id = update.get("update_id")
        if isinstance(update_id, bool) or not isinstance(update_id, int):
            update_id = None
        if update_id is not None:
            with self._lock:
                seen = self._recent.begin(update_id, monotonic())
                if seen == "done":
                    self.stats["duplicates"] += 1
                    return 200  # Telegram re-sent one we already handled
                if seen == "busy":
                    self.stats["in_progress"] += 1
                    return 503  # the first delivery may still fail: ask for another
        status, kind = 500, None
        try:
            event = update_to_event(update)
            if event is not None and self._room.bot_full():
                with self._lock:
                    self.stats["bot_busy"] += 1
                return 429  # max_pending replies across all chats: Telegram keeps it
            if event is not None and not self._room.available(event.chat.id):
                return 429  # its chat's queue has no room: held back before it runs
            kind, outcome = _offer(self.engine, self.sender, self._capabilities, update, event)
            if outcome is not None:
                self._room.learn(outcome)
                if outcome.refused["queue_full"]:
                    self._room.learn_refusal(event.chat.id)
            status = {ACCEPTED: 200, IGNORED: 200, BUSY: 429, CLOSED: 503}[kind]
            if kind == BUSY:
                _log.info("webhook: update %s for chat %r answered 429: every reply was "
                          "refused, its chat's queue is full (Telegram delivers it again)",
                          update_id, outcome.event.chat.id)
            elif kind == CLOSED:
                _log.info("webhook: update %s answered 503: shutting down (Telegram "
                          "delivers it again)", update_id)
            elif outcome is not None:
                outcome.add_done_callback(lambda o, uid=update_id: self._settled(uid, o))
                confirm = getattr(self.sender, "confirm_durable", None)  # with an outbox
                if confirm is not None and not confirm(outcome):
                    status = 503  # its replies are not durable: Telegram delivers it again
        finally:
            with self._lock:
                if status == 200:
                    self.stats["ignored" if kind == IGNORED else "handled"] += 1
                if update_id is not None:
                    self._recent.end(update_id, status == 200, monotonic())
        return status

    def _settled(self, update_id, outcome):
        self._room.learn(outcome)
        lost = _report_lost(update_id, outcome)
        if lost:
            with self._lock:
                self.stats["lost_replies"] += lost


_UNSET: Any = object()

NO_SECRET_ADVICE = (
    "anyone who finds the URL can post forged updates to the bot. Pass secret_token= "
    "(1-256 characters A-Z, a-z, 0-9, _ and -) and give the same value to setWebhook "
    "(run_webhook(webhook_url=...) registers the webhook with a random one for you)")


def webhook_app(engine: Any, sender: Any, secret_token: Optional[str] = _UNSET, *,
                max_body: int = 1 << 20, remember: int = 100_000,
                remember_seconds: float = 600.0,
                max_pending: Optional[int] = DEFAULT_MAX_PENDING) -> WebhookApp:
    """A WSGI application that receives Telegram's webhook POSTs.

    - not POST -> 405; a ``secret_token`` was given and the
      ``X-Telegram-Bot-Api-Secret-Token`` header differs (compared in
      constant time) or is missing -> 403, before the body is read;
    - closed (:meth:`WebhookApp.close`, a shutdown) -> 503, unread;
    - no length -> 411; more than ``max_body`` bytes -> 413, unread;
      not a JSON object -> 400;
    - otherwise the update goes to ``engine.handle_event`` (run in the
      server's request thread; replies are queued on the dispatcher, so this
      is quick) and the answer says what became of it: 200 once it was
      accepted (the handlers ran, their replies are queued); 429 when every
      reply it made was refused because its chat's queue is full, and 503
      when the engine is shutting down: Telegram then delivers it again
      later, and its id is not remembered.  So is every text message while
      ``max_pending`` replies are queued or running across all chats (a
      flood from many chats stays with Telegram instead of in memory; None:
      no bot-wide bound).  Update kinds that are not text messages are
      answered 200 and ignored.
    - Re-deliveries: the ids answered 200 within the last
      ``remember_seconds`` (at most ``remember`` of them; about 140 bytes
      each) are answered 200 again without running the update twice; one
      that arrives while its first delivery is still being handled gets 503.

    It never raises into the server; nothing it keeps grows with the number
    of requests beyond those bounds.  Set the same ``secret_token`` in
    ``setWebhook`` (``run_webhook`` does both).  ``secret_token`` must be
    given: ``secret_token=None`` (only where something in front of the app
    checks the header) is logged as a warning, since anyone who finds the
    URL can then post updates.
    """
    if secret_token is _UNSET:
        raise TypeError("webhook_app needs secret_token=: the value given to setWebhook's "
                        "secret_token, which Telegram sends in every request (or "
                        "secret_token=None to accept updates from anyone who finds the URL)")
    if secret_token is not None:
        if not isinstance(secret_token, str):
            raise TypeError("secret_token must be a str or None")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", secret_token):
            raise ValueError("secret_token must be 1-256 characters A-Z, a-z, 0-9, _ and - "
                             "(what Telegram's setWebhook accepts)")
    if not callable(getattr(engine, "process_event", None)):
        raise TypeError("engine must have a process_event(event, sender, capabilities) method")
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
        raise ValueError("max_body must be a positive int")
    if isinstance(remember, bool) or not isinstance(remember, int) or remember < 0:
        raise ValueError("remember must be a non-negative int")
    if isinstance(remember_seconds, bool) or not isinstance(remember_seconds, (int, float)) or \
            not 0 <= remember_seconds < float("inf"):
        raise ValueError("remember_seconds must be a non-negative finite number of seconds")
    if secret_token is None:
        _log.warning("webhook_app(secret_token=None): %s", NO_SECRET_ADVICE)
    return WebhookApp(engine, sender, secret_token, max_body, remember, float(remember_seconds),
                      _check_max_pending(max_pending))
