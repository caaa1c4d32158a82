"""A till in Python, with no Rust of its own: it holds the server's
products and its own orders in a SQLite file, sells with the standard
library's sqlite3 while the replica runs, waits until what the server made
of its sales (receipts) came back, and reads them. It then keeps the file
in sync until its standard input closes (Ctrl-D).

    python3 till.py SERVER TILL_ID SECRET_FILE SERVER_KEY DB SALES

The tests run it against a real server (crates/magic_sync_ffi/tests).
"""

import json
import sqlite3
import sys

import magic_sync


def main() -> int:
    server, till, secret_file, server_key, db, sales = sys.argv[1:7]
    with open(secret_file) as f:
        secret = f.readline().strip()
    # The app writes the file while the replica's loop runs: safe only when
    # both use one SQLite in this process (see shares_sqlite).
    if not magic_sync.shares_sqlite():
        print("this Python carries a SQLite of its own: run magic-sync-replica beside it", file=sys.stderr)
        return 1

    with magic_sync.Replica(db, till) as replica:
        replica.run(server, secret, server_key)
        replica.wait_ready(timeout=60)

        app = sqlite3.connect(db, timeout=30)
        (products,) = app.execute("SELECT count(*) FROM products").fetchone()
        # A sale is the till's own record: it goes up.
        for n in range(1, int(sales) + 1):
            with app:
                app.execute("INSERT INTO sales (id, till, total) VALUES (?, ?, ?)", (f"{till}-{n}", till, "12.50"))
            replica.nudge()

        mark = replica.mark()
        # Reached: the server filed the sales, and everything it did because
        # of them (the receipts its trigger wrote) is applied here.
        written = replica.wait_written(mark, magic_sync.Written.REACHED, timeout=60)
        if written < magic_sync.Written.REACHED:
            print(f"the receipts did not all come back: {replica.status()}", file=sys.stderr)
            return 1
        receipts = app.execute("SELECT count(*), sum(total_with_tax) FROM receipts").fetchone()
        (integrity,) = app.execute("PRAGMA integrity_check").fetchone()
        app.close()
        report = {"products": products, "receipts": receipts, "integrity": integrity, "status": replica.status()}
        print(json.dumps(report), flush=True)

        # A till keeps syncing until it is told to stop.
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
