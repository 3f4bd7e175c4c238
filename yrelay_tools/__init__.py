"""yrelay's tooling, kept out of the runtime package ``yrelay``: the benchmark
harness (``bench``, `yrelay bench`), the fault-injection suite (``chaos``,
`yrelay chaos`), the test helpers (``testing``: server processes, the
delivery checker, deliberately broken builds) and the synthetic event logs of
the analytics tests and benchmark (``analytics_data``). It ships in the same
distribution; its third-party needs come with the ``bench``/``chaos`` extras."""
