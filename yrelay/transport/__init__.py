"""What runs under the ASGI app, inside uvicorn: the HTTP protocol with the
request-head deadline and caps (:mod:`.http_guard`), the websocket protocol
with the pre-authentication frame cap, the receive queue and the per-frame
debt (:mod:`.ws_protocol`), and the small pieces they are made of (a debt
bucket, a frame walker, lean asyncio primitives, frames encoded once).

It imports nothing else of yrelay, so the settings (:mod:`yrelay.config`)
can hand these classes to uvicorn without importing the server."""
