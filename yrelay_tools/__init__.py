"""yrelay's tooling, kept out of the runtime package ``yrelay``: the benchmark
harness (``bench``, `yrelay bench`), the fault-injection suite (``chaos``,
`yrelay chaos`) and the test helpers (``testing``: server processes, the
delivery checker, deliberately broken builds). It ships in the same
distribution; its third-party needs come with the ``bench``/``chaos`` extras."""
