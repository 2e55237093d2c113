"""bench/switch_sources.py: each involuntary switch is put in the group its call stack names.

A design benchmark of the repository (skipped where ``bench/`` is absent).
The script itself needs perf and leave to trace the scheduler; what is
tested here is its reading of ``perf script`` text: only switches away from
a runnable thread count, and each one falls in the first group whose test
its stack passes (the design note's table in bench/notes/freethreading.md is made
of these groups).
"""

import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
if not os.path.isfile(os.path.join(BENCH, "switch_sources.py")):
    # a copy of tests/ beside an installed wheel: the script is the repository's
    pytest.skip("needs the source checkout's bench/", allow_module_level=True)
sys.path.insert(0, BENCH)
try:
    import switch_sources as ss
finally:
    sys.path.remove(BENCH)


def _event(state, *frames):
    head = ("python 22757 [000]  2050.324698: sched:sched_switch: prev_comm=python "
            "prev_pid=22757 prev_prio=120 prev_state=%s ==> next_comm=python next_pid=22755 "
            "next_prio=120" % state)
    kernel = ["ffffffff82248208 __schedule+0x628 ([kernel.kallsyms])",
              "ffffffff82248b73 schedule+0x23 ([kernel.kallsyms])"]
    return "\n\t".join([head] + kernel + ["2a1a94 %s+0x10 (python3.13t)" % f for f in frames])


YIELD = ("__x64_sys_sched_yield", "__GI_sched_yield", "_Py_yield", "_PyMutex_LockTimed",
         "PyMutex_Lock")


def test_each_switch_of_a_runnable_thread_falls_in_the_first_group_that_names_it():
    text = "\n\n".join([
        # a woken SimpleQueue sleeper spinning for the queue's critical section
        _event("R", *YIELD, "_PyMutex_Lock", "_PyCriticalSection_Resume", "_PySemaphore_Wait",
               "_PyParkingLot_Park"),
        # the same critical-section code, but a dict of the chat map
        _event("R+", *YIELD, "_PyMutex_Lock", "_PyCriticalSection_BeginSlow",
               "_PyCriticalSection_Begin", "PyDict_Pop",
               "__pyx_f_12fastdispatch_8_ringbuf_8_ChatMap__remove_locked"),
        # the core's own lock, after its spin (through fd_mutex_lock or inlined)
        _event("R", *YIELD, "_PyMutex_Lock", "fd_mutex_lock_parking", "fd_mutex_lock",
               "__pyx_f_12fastdispatch_8_ringbuf_10_Deadlines__timer_needed"),
        _event("R", *YIELD, "__pyx_f_12fastdispatch_8_ringbuf_5_Pool__next_chat"),
        # a mutex of CPython's own, taken on the core's behalf: not the core's lock
        _event("R", *YIELD, "_PyMutex_Lock", "_Py_brc_queue_object",
               "__pyx_f_12fastdispatch_8_ringbuf_5_Pool__ready_popleft"),
        _event("R", *YIELD, "_PyMutex_Lock", "_PyThreadState_Suspend",
               "__pyx_pf_12fastdispatch_8_ringbuf_5_Pool_2_worker_main"),
        # preempted by the thread it woke
        _event("R", "futex_wake", "__new_sem_post", "_PySemaphore_Wakeup",
               "_PyParkingLot_Unpark", "_queue_SimpleQueue_put_impl"),
        _event("R+", "irqentry_exit_to_user_mode", "asm_sysvec_apic_timer_interrupt",
               "_PyObject_MiMalloc"),
        # asleep (a voluntary switch): not counted
        _event("S", "futex_do_wait", "__futex_wait", "_PySemaphore_Wait"),
        _event("D", "io_schedule"),
    ])
    counts = ss.group_counts(text)
    assert list(counts) == [name for name, _ in ss.GROUPS]  # every group, in order
    assert sum(counts.values()) == 8
    assert counts[ss.GROUPS[0][0]] == 1        # SimpleQueue wake
    assert counts[ss.GROUPS[1][0]] == 1        # a dict of the chat map
    assert counts[ss.GROUPS[3][0]] == 1        # biased reference counting
    assert counts[ss.GROUPS[5][0]] == 2        # the core's own locks
    assert counts[ss.GROUPS[6][0]] == 1        # the waker preempted
    assert counts[ss.GROUPS[7][0]] == 1        # another sched_yield (thread-state suspend)
    assert counts[ss.GROUPS[8][0]] == 1        # a timer tick


def test_the_script_refuses_no_rounds_and_names_the_argument():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "switch_sources.py"), "--python",
                        sys.executable, "--rounds", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--rounds must be at least 1" in r.stderr


@pytest.mark.parametrize("mode", ["post", "submit"])
def test_the_child_runs_the_workload_and_reports_its_switches(mode):
    # The child alone (perf is not needed to run it): the workload it times.
    r = subprocess.run([sys.executable, "-c", ss.CHILD, mode, "1"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(mode + ": ") and "involuntary switches" in r.stdout, r.stdout
