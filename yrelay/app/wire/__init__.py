"""The wire formats at the edge of the connection core: a codec and an
endpoint per protocol (``/ws``: JSON frames; ``/yws``: y-protocols)."""
