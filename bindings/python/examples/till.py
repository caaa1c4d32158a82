"""A till in Python, with no Rust of its own: it holds the server's
products and its own orders in a SQLite file, sells with the standard
library's sqlite3, and waits until the server filed the sale.

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
        mark = replica.mark()
        written = replica.wait_written(mark, magic_sync.Written.FILED, timeout=60)
        if written < magic_sync.Written.FILED:
            print(f"the sale was not filed: {replica.status()}", file=sys.stderr)
            return 1

        print(json.dumps({"products": products, "written": written.name, "status": replica.status()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
