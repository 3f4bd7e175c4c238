"""/ops/groups on a running server: the list, one group's members,
assignments and lag per document, and deleting a group (its members are
told and stop; its progress goes)."""

from __future__ import annotations

from collections import Counter

from conftest import OPS_AUTH as AUTH
from conftest import eventually
from consumerutil import Worker
from test_consumers import write
from yrelay.storage.keys import group_leases_key, group_meta_key, group_progress_key, groups_key


async def test_groups_are_listed_described_and_deleted(ops, redis_client, store):
    docs = [f"doc-{i}" for i in range(4)]
    await write(store, docs, 2)
    processed: Counter = Counter()
    a, b = [await Worker(redis_client, name, processed).start() for name in ("a", "b")]
    try:
        await eventually(lambda: len(a.group.documents) == 2 and len(b.group.documents) == 2, timeout=10)
        await eventually(lambda: len(processed) == 8, timeout=10)
        b.acking = False
        behind = await write(store, b.group.documents, 3, word="late")  # b processes these and never acks
        await eventually(
            lambda: all(key in processed for doc in behind for key in ((doc, entry) for entry in behind[doc])),
            timeout=10,
        )
        assert (await ops.get("/ops/groups")).status_code == 401
        listed = (await ops.get("/ops/groups", headers=AUTH)).json()["groups"]
        group = next(item for item in listed if item["group"] == "idx")
        assert group["members"] == ["a", "b"] and group["leader"] in ("a", "b") and group["documents"] == 4

        detail = (await ops.get("/ops/groups/idx", headers=AUTH)).json()
        assert {m["member"] for m in detail["members"] if m["alive"]} == {"a", "b"}
        rows = {row["doc"]: row for row in detail["assignments"]}
        assert set(rows) == set(docs)
        for doc in docs:
            late = doc in behind
            assert rows[doc]["lag_entries"] == (3 if late else 0), rows[doc]
            assert rows[doc]["member"] == ("b" if late else "a")
        assert (await ops.get("/ops/groups/nope", headers=AUTH)).status_code == 404
        assert (await ops.get("/ops/groups/bad%20name", headers=AUTH)).status_code == 422

        deleted = await ops.delete("/ops/groups/idx", headers=AUTH)
        assert deleted.status_code == 200 and deleted.json()["documents_cleared"] == 4
        # Told at their next heartbeat: both stop, and nothing of the group is left.
        await eventually(lambda: a.group.deleted and b.group.deleted, timeout=5)
        await eventually(lambda: a._task.done() and b._task.done(), timeout=5)  # batches() ended
        assert not await redis_client.sismember(groups_key(), "idx")
        assert not await redis_client.exists(group_meta_key("idx"))
        for doc in docs:
            assert await redis_client.zscore(group_progress_key(doc), "idx") is None
            assert not await redis_client.hexists(group_leases_key(doc), "idx")
        assert (await ops.get("/ops/groups/idx", headers=AUTH)).status_code == 404
        assert (await ops.delete("/ops/groups/idx", headers=AUTH)).status_code == 404
    finally:
        await a.stop()
        await b.stop()
    # A new member starts the group again, from each document's snapshot or first entry.
    again = await Worker(redis_client, "c", Counter()).start()
    try:
        await eventually(lambda: len(again.group.documents) == 4, timeout=10)
    finally:
        await again.stop()
