"""A till in Python, with no Rust of its own: it holds the server's
products and its own orders in a SQLite file, sells with the standard
library's sqlite3, waits until what the server made of the sale (a
receipt) came back, and reads it.

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

    with magic_sync.Replica(db, till) as replica:
        replica.run(server, secret, server_key)
        replica.wait_ready(timeout=60)

        app = sqlite3.connect(db, timeout=30)
        (products,) = app.execute("SELECT count(*) FROM products").fetchone()

        # A sale is the till's own record: it goes up.
        with app:
            app.execute(
                "INSERT INTO sales (id, till, total) VALUES (?, ?, ?)",
                (sale, till, "12.50"),
            )
        replica.nudge()
        mark = replica.mark()
        # Reached: the server filed the sale, and everything it did because
        # of it (the receipt its trigger wrote) is applied here.
        written = replica.wait_written(mark, magic_sync.Written.REACHED, timeout=60)
        if written < magic_sync.Written.REACHED:
            print(f"the sale's receipt did not come back: {replica.status()}", file=sys.stderr)
            return 1
        receipt = app.execute("SELECT sale_id, total_with_tax FROM receipts WHERE sale_id = ?", (sale,)).fetchone()

        print(json.dumps({"products": products, "receipt": receipt, "status": replica.status()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
