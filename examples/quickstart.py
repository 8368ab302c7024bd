"""flakekit's library API in one page. Run: python examples/quickstart.py"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import flakekit

# 1. An in-process generator with a fixed worker id (you guarantee no other live process
#    uses worker 7). It is started already: it may issue IDs at once.
gen = flakekit.snowflake(worker_id=7)
one = gen.next_id()
batch = gen.next_ids(1000)            # an IdBatch: a few range objects, not 1000 ints
print("one id:      ", one)
print("a batch:     ", batch, "first", batch[0], "last", batch[-1])
assert len(set(batch)) == 1000 and one not in batch

# 2. Decode an ID with the layout that made it.
snowflake = flakekit.layout("snowflake")
print("decomposed:  ", snowflake.decompose(one))      # {'time': ..., 'worker': 7, 'sequence': ...}
print("made at:     ", snowflake.timestamp(one).isoformat())
print("composed:    ", snowflake.compose(time=snowflake.decompose(one)["time"], worker=7))
gen.close()                           # no more IDs from it; start() again to reuse

# 3. Layouts: what a layout can hold.
for name in ("snowflake", "sonyflake", "region-split"):
    cap = flakekit.layout(name).capacity()
    print(f"{name:<13} {cap.ids_per_second_per_worker:>12,.0f} IDs/s per worker, "
          f"{cap.max_workers:>6,} workers, overflows {cap.overflows_at:%Y}")

# 4. A config file, examples/flakekit.toml: a custom layout and two generators; `with kit:`
#    starts them (leases a worker id from the SQLite file) and releases everything at the end.
with tempfile.TemporaryDirectory() as tmp:
    os.environ["FLAKEKIT_DB_FILE"] = str(Path(tmp, "ids.db"))   # its ${FLAKEKIT_DB_FILE}
    # checks every name and setting; takes no lease yet
    kit = flakekit.load(Path(__file__).with_name("flakekit.toml"))
    with kit:
        orders = kit["orders"]
        order_id = orders.next_id()
        print("orders id:   ", order_id, kit.config.layouts["orders-layout"].decompose(order_id))
        print("audit ids:   ", list(kit["audit"].next_ids(3)))
        print("orders stats:", orders.stats().as_dict())

# 5. Bad input gets one clear error naming the field.
try:
    flakekit.layout("snowflake").compose(time=1, worker=5000)
except flakekit.LayoutError as exc:
    print("error:       ", exc)
