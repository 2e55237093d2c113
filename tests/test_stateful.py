"""Hypothesis state machines: the ring buffer and the stats accounting.

Each machine is checked against a plain model (a deque; a dict of counters)
through random sequences of operations, on both core implementations.
"""

import collections
import threading

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from fastdispatch import DispatcherClosed, QueueFull, TaskDiscarded


def _ring_machine(impl):
    class RingBufferMatchesDeque(RuleBasedStateMachine):
        @rule(capacity=st.integers(1, 40))
        @precondition(lambda self: not hasattr(self, "ring"))
        def create(self, capacity):
            self.ring = impl.RingBuffer(capacity)
            self.model = collections.deque()
            self.capacity = capacity

        @rule(item=st.integers())
        @precondition(lambda self: hasattr(self, "ring"))
        def push(self, item):
            accepted = self.ring.push(item)
            assert accepted == (len(self.model) < self.capacity)
            if accepted:
                self.model.append(item)

        @rule()
        @precondition(lambda self: hasattr(self, "ring"))
        def pop(self):
            if self.model:
                assert self.ring.pop() == self.model.popleft()
            else:
                with pytest.raises(IndexError):
                    self.ring.pop()

        @rule()
        @precondition(lambda self: hasattr(self, "ring"))
        def clear(self):
            assert self.ring.clear() == list(self.model)
            self.model.clear()

        @invariant()
        def same_length(self):
            if hasattr(self, "ring"):
                assert len(self.ring) == len(self.model)
                assert self.ring.full == (len(self.model) == self.capacity)

    return RingBufferMatchesDeque


def test_ring_buffer_behaves_like_a_bounded_deque(impl):
    run_state_machine_as_test(
        _ring_machine(impl),
        settings=settings(max_examples=60, stateful_step_count=60, deadline=None))


class Panic(BaseException):
    pass


def _stats_machine(impl):
    class StatsMatchModel(RuleBasedStateMachine):
        """Every step is settled before the next, so the model is exact."""

        def __init__(self):
            super().__init__()
            self.d = impl.OutboundDispatcher(max_inflight=3, queue_size=4,
                                             send_timeout=None, idle_timeout=1.0)
            self.model = collections.Counter()

        def teardown(self):
            assert self.d.shutdown(timeout=10)

        def _gate(self, chat):
            started, gate = threading.Event(), threading.Event()
            self.d.submit(chat, lambda sc: (started.set(), gate.wait(10)))
            assert started.wait(10)
            self.model["submitted"] += 1
            self.model["completed"] += 1
            return gate

        chats = st.sampled_from(["a", "b", 7, ("c", 1)])

        @rule(chat=chats, n=st.integers(0, 3), post=st.booleans())
        @precondition(lambda self: not self.model["closed"])
        def succeed(self, chat, n, post):
            for _ in range(n):
                (self.d.post if post else self.d.submit)(chat, lambda sc: None)
            self.model["submitted"] += n
            self.model["completed"] += n

        @rule(chat=chats)
        @precondition(lambda self: not self.model["closed"])
        def fail(self, chat):
            fut = self.d.submit(chat, lambda sc: 1 / 0)
            with pytest.raises(ZeroDivisionError):
                fut.result(10)
            self.model["submitted"] += 1
            self.model["failed"] += 1

        @rule(chat=chats, behind=st.integers(0, 2))
        @precondition(lambda self: not self.model["closed"])
        def panic(self, chat, behind):
            gate = self._gate(chat)

            def explode(sc):
                raise Panic()

            boom = self.d.submit(chat, explode)
            rest = [self.d.submit(chat, lambda sc: None) for _ in range(behind)]
            gate.set()
            for fut in [boom] + rest:
                with pytest.raises(TaskDiscarded):
                    fut.result(10)
            self.model["submitted"] += 1 + behind
            self.model["failed"] += 1
            self.model["discarded"] += behind

        @rule(chat=chats, extra=st.integers(1, 3))
        @precondition(lambda self: not self.model["closed"])
        def overflow(self, chat, extra):
            gate = self._gate(chat)
            for _ in range(4):
                self.d.submit(chat, lambda sc: None)
            for _ in range(extra):
                with pytest.raises(QueueFull):
                    self.d.submit(chat, lambda sc: None)
            gate.set()
            self.model["submitted"] += 4
            self.model["completed"] += 4
            self.model["rejected"] += extra

        @rule(chat=chats)
        @precondition(lambda self: not self.model["closed"])
        def cancel_waiting(self, chat):
            gate = self._gate(chat)
            assert self.d.submit(chat, lambda sc: None).cancel()
            gate.set()
            self.model["submitted"] += 1
            self.model["cancelled"] += 1

        @rule()
        @precondition(lambda self: self.model["closed"] == 0)
        def close(self):
            self.d.close()
            self.model["closed"] = 1

        @rule(chat=chats, post=st.booleans())
        @precondition(lambda self: self.model["closed"])
        def refused_after_close(self, chat, post):
            with pytest.raises(DispatcherClosed):
                (self.d.post if post else self.d.submit)(chat, lambda sc: None)
            self.model["rejected"] += 1

        @invariant()
        def counters_match_the_model(self):
            assert self.d.drain(timeout=10)
            s = self.d.stats()
            for name in ("submitted", "completed", "failed", "rejected",
                         "discarded", "cancelled", "timed_out"):
                assert getattr(s, name) == self.model[name], name
            assert s.submitted == (s.completed + s.failed + s.discarded
                                   + s.cancelled + s.timed_out)
            assert s.active_chats == 0 and s.inflight == 0

    return StatsMatchModel


def test_stats_accounting_matches_a_model(impl):
    run_state_machine_as_test(
        _stats_machine(impl),
        settings=settings(max_examples=25, stateful_step_count=12, deadline=None))


def test_ring_buffer_init_again_empties_it(impl):
    ring = impl.RingBuffer(3)
    for i in range(3):
        assert ring.push(i)
    ring.__init__(2)
    assert len(ring) == 0 and ring.capacity == 2
    assert ring.push("a") and ring.push("b") and not ring.push("c")
    assert [ring.pop(), ring.pop()] == ["a", "b"]
    with pytest.raises(ValueError):
        impl.RingBuffer(0)
