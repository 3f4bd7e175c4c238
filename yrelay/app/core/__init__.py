"""The connection core: one receive loop, the subscriptions and their sender,
the write path, presence, and the limits every protocol gets; it knows no
wire format (its codecs are :mod:`yrelay.app.wire`'s)."""
