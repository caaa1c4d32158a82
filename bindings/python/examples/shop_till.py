"""A till of the demo's shop, in Python: the replica follows the server's
description, and this app sells a product now and then and counts its
stock with the standard library's sqlite3. `cargo run -p demo --
--python-till` runs one of its tills so. Give the key as `--server-key=KEY`:
one key in 64 begins with `-`, which argparse would take for an option.

    python3 shop_till.py --server URL --secret-file F --id TILL \\
        --server-key=KEY --db FILE [--trust PEM] \\
        [--sell-every-ms MS] [--sales N] [--until-stdin-closes]
"""

import argparse
import sqlite3
import sys
import threading
import time

import magic_sync


def sell(replica: magic_sync.Replica, db: str, till: str, every: float, sales: int, stop: threading.Event) -> None:
    """Sells a random product every `every` seconds, `sales` times, once the
    till holds its products; counts one off the product's stock each time."""
    app = sqlite3.connect(db, timeout=30, isolation_level=None)
    made = None
    sold = 0
    while sold < sales and not stop.wait(every):
        try:
            if made is None:
                # Sales go on from where an earlier run stopped.
                (made,) = app.execute("SELECT count(*) FROM sales WHERE till = ?", (till,)).fetchone()
            product = app.execute("SELECT id, price FROM products ORDER BY random() LIMIT 1").fetchone()
        except sqlite3.OperationalError:
            # The server has not described the tables yet.
            continue
        if product is None:
            continue
        made += 1
        sold += 1
        app.execute("BEGIN IMMEDIATE")
        app.execute(
            "INSERT INTO sales (id, till, product_id, total) VALUES (?, ?, ?, ?)",
            (f"{till}-{made}", till, product[0], product[1]),
        )
        app.execute(
            "UPDATE stock SET counted = coalesce(counted, on_hand) - 1 WHERE till = ? AND product_id = ?",
            (till, product[0]),
        )
        app.execute("COMMIT")
        replica.nudge()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--server-key", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--trust")
    parser.add_argument("--sell-every-ms", type=int)
    parser.add_argument("--sales", type=int, default=sys.maxsize)
    parser.add_argument("--until-stdin-closes", action="store_true")
    args = parser.parse_args()
    with open(args.secret_file) as f:
        secret = f.readline().strip()

    # The app writes the file while the replica's loop runs: safe only when
    # both use one SQLite in this process (see magic_sync.shares_sqlite).
    if not magic_sync.shares_sqlite():
        print(f"python till `{args.id}`: this Python carries a SQLite of its own", file=sys.stderr)
        return 1
    stop = threading.Event()
    with magic_sync.Replica(args.db, args.id) as replica:
        replica.trust_certificates(args.trust)
        replica.run(args.server, secret, args.server_key)
        print(f"python till `{args.id}`: running; it connects to {args.server}", file=sys.stderr)
        selling = None
        if args.sell_every_ms:
            selling = threading.Thread(
                target=sell,
                args=(replica, args.db, args.id, args.sell_every_ms / 1000, args.sales, stop),
                daemon=True,
            )
            selling.start()
        if args.until_stdin_closes:
            sys.stdin.read()
        else:
            while True:
                time.sleep(3600)
        stop.set()
        if selling is not None:
            selling.join()
        status = replica.status()
        if status.get("link_error"):
            print(f"python till `{args.id}`: {status['link_error']}", file=sys.stderr)
    # Closed: the loop finished the message it applied.
    return 0


if __name__ == "__main__":
    sys.exit(main())
