"""``marti bench scale``: 1,000 concurrent env sessions and 1,000 concurrent broker agents on real servers.

Each server runs in its own process (``marti env-server`` / ``marti broker``, started by :mod:`marti.command.stack` on
port 0). The burst phases below drive it from this process, one asyncio event loop over one shared
``grpc.aio`` channel per server (``marti.aio`` clients), all N at once: their latencies are queueing. The paced
phase (further below) drives fresh servers from several processes at a fixed rate.

env_server (``--sessions N``, default 1,000), ``--env-rounds`` times (default 3) on fresh sessions: create N
``collaborative_task_solving`` / resource_allocation sessions at once, reset all at once, step every session
``--turns`` times (one ``Step`` rpc per step, all sessions concurrently), then ``--turns`` more turns as one
``BatchStep`` of all N sessions per turn, then close all at once. An episode that ends is reset before its
next step. A session succeeds when all of its calls did. The table shows round 1; ``--json`` has every round.
The server's RSS (``/proc/PID/status``) is read before, after each phase and one second after the closes; the
leak check (:func:`leak_check`) says whether RSS came back near the baseline after the closes and whether the
RSS with all N sessions live grows from round to round.

comm_broker (``--agents N``, default 1,000, in ``--broker-sessions`` sessions, default 1): every agent joins
(``get_messages`` with no wait), then all agents at once run ``--messages`` rounds (default 10): send one
message (700 to 800 bytes of JSON) to the next agent of its session (a ring), then long-poll its mailbox
until it holds the message of that round from the previous agent. SDK defaults otherwise (batches of 128, a
1 ms linger, auto-ack). Checked: every message sent is delivered exactly once, from the right sender, in
order; latency is end to end (the envelope's ``sent_at`` to the receiving agent holding it); the broker's own
counters (``GetStats``) are reported next to the agents' counts and must agree with them.

Limits: where a server's default (``services/*/settings.py``, after ``MARTI_*`` variables) is below what N
needs, the bench raises it with the server's flag and prints it. ``--at-limit`` instead sets the session cap
of the env server and the agents-per-session cap of the broker to exactly what the run needs, and records
what one more session / one more agent gets (the typed error and its message); after the closes it checks
that a new env session is accepted again (the closed sessions freed their slots).

Idle memory and paced load (the issue's targets), on a fresh env server and a fresh broker, both up at once and
started with the same limit flags: one warm-up session / agent, the idle RSS (median of ``RSS_SAMPLES`` reads
after a quiet second), then N env sessions created and reset and N agents joined with empty mailboxes (at most
``SETUP_CONCURRENCY`` calls in flight), the idle RSS again: KB per idle session and per idle mailbox, against
``SESSION_TARGET_KB`` and ``MAILBOX_TARGET_KB``. Then, unless ``--no-paced``, ``--procs`` client processes
(default 4; ``python -m benchmarks.scale --paced-worker``) each take a contiguous slice of the sessions and
agents and, from a common start, run an open-loop schedule for ``--paced-seconds`` (default 20) at
``--paced-rate`` calls a second per service, all processes together (default 200: what this 2-core machine
holds at its throughput; see docs/benchmarks.md). A call starts at its scheduled time whether or not the
previous ones have ended; latency runs from the scheduled start, so a server or a client that falls behind
shows in it (the lateness of the starts is reported too). env call: one ``Step`` of one session; broker call:
one ``send_message`` with ``batching_size=1`` (sent at once) to another agent of the process's slice, plus
that agent's ``get_messages`` until it holds the message. Reported per service: calls scheduled, ok, errors,
offered and achieved rate, p50/p99/max latency against ``P99_TARGET_MS``, calls over it by second, server
CPU per call; and the idle RSS once more after the calls (what a used session / mailbox holds when idle).

Prints the burst table (service / phase: N, ok, errors, p50 and p99 latency, rate, server RSS after the phase),
the checks, the paced table and the memory table (each row: met or missed), and the load average before and
after; ``--json PATH`` also writes every number. Returns 1 when a check fails (a session or a message short, a
duplicate, a limit probe answered otherwise than expected, a suspected leak, a server that died, a paced call
or an idle-phase call that failed), else 0; a missed target is reported, not a failed check (it depends on the
machine and its load). ``--quick`` is a small run (20 sessions, 20 agents, 40 calls/s from 2 processes for
2 s) for tests.

Modules: :mod:`.settings` (runs, constants, targets), :mod:`.servers` (each server through :mod:`marti.command.stack`,
/proc readings, limits), :mod:`.phase`, :mod:`.env_burst`, :mod:`.broker_burst`, :mod:`.idle`, :mod:`.paced` and
:mod:`.paced_worker` (the phases), :mod:`.tables` and :mod:`.summary` (what is printed), :mod:`.cli` (the flags
and the run).
"""

from benchmarks.scale.cli import main

__all__ = ["main"]
