"""The fault-injection suite: N client processes (some without persistence)
on M documents through K server processes on one Redis, a nemesis injecting
faults on a seeded schedule, and a checker proving no acknowledged update was
lost, nothing stored is stuck and every stream folds (docs/reliability.md).

``proxy`` (a loopback TCP proxy with faults), ``cluster`` (servers, Redis,
replica), ``workload`` / ``clients`` (a client process and the harness's
handle on it), ``nemesis`` (the schedule and the faults), ``checker``,
``report``, ``run`` (one run, start to finish: ``run_chaos``).
"""
