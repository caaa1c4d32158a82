"""A till in Python, with no Rust of its own: it holds the server's
products and its own orders in a SQLite file, sells with the standard
library's sqlite3, waits until what the server made of the sale (a
receipt) came back, and reads it. It takes turns between the replica and
sqlite3 (see main): the library carries a SQLite of its own.

    python3 till.py SERVER TILL_ID SECRET_FILE SERVER_KEY DB SALE_ID

The tests run it against a real server (crates/magic_sync_ffi/tests).
"""

import json
import sqlite3
import sys

import magic_sync


def main() -> int:
    server, till, secret_file, server_key, db, sale = sys.argv[1:7]
    with open(secret_file) as f:
        secret = f.readline().strip()

    # The library carries its own SQLite, and two SQLite libraries in one
    # process do not see each other's locks: while the replica is open, this
    # process must not open its file with the standard library's sqlite3.
    # The till takes turns, closing one before it opens the other.
    with magic_sync.Replica(db, till) as replica:
        replica.run(server, secret, server_key)
        replica.wait_ready(timeout=60)

    app = sqlite3.connect(db, timeout=30)
    (products,) = app.execute("SELECT count(*) FROM products").fetchone()
    # A sale is the till's own record: it goes up.
    with app:
        app.execute("INSERT INTO sales (id, till, total) VALUES (?, ?, ?)", (sale, till, "12.50"))
    app.close()

    with magic_sync.Replica(db, till) as replica:
        replica.run(server, secret, server_key)
        mark = replica.mark()
        # Reached: the server filed the sale, and everything it did because
        # of it (the receipt its trigger wrote) is applied here.
        written = replica.wait_written(mark, magic_sync.Written.REACHED, timeout=60)
        status = replica.status()
    if written < magic_sync.Written.REACHED:
        print(f"the sale's receipt did not come back: {status}", file=sys.stderr)
        return 1

    app = sqlite3.connect(db, timeout=30)
    receipt = app.execute("SELECT sale_id, total_with_tax FROM receipts WHERE sale_id = ?", (sale,)).fetchone()
    app.close()
    print(json.dumps({"products": products, "receipt": receipt, "status": status}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
