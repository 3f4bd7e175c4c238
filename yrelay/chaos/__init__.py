"""The fault-injection suite: N client processes on M documents through K
server processes on one Redis, a nemesis injecting faults on a seeded
schedule, and a checker proving no acknowledged update was lost
(docs/reliability.md).

``proxy`` (a loopback TCP proxy with faults), ``cluster`` (servers, Redis,
replica), ``workload`` / ``clients`` (a client process and the harness's
handle on it), ``nemesis`` (the schedule and the faults), ``checker``,
``report``, ``run`` (one run, start to finish: ``run_chaos``).
"""

