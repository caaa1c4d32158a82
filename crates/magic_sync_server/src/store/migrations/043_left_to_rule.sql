-- What the record leaves to the rule, summed (decision 177). With the rows
-- a holder's own rule gives it left without a record row (decision 176),
-- the operator's reads would have to read the rule to count them; they
-- read the `sync` schema alone. So the record keeps, per holder and table,
-- how many rows it holds by its rule alone, moved by every statement that
-- moves a row between the record and the rule: a provisioning's rows not
-- recorded add, a record row let go as saying only what the rule says adds
-- one, a row held by its rule alone that is recorded or taken back takes
-- one. A holder provisioned again, or forgotten, starts from nothing.
CREATE TABLE sync.left_to_rule (
    replica    text   NOT NULL,
    table_name text   NOT NULL,
    rows       bigint NOT NULL,
    PRIMARY KEY (replica, table_name)
);

-- A record row let go to its rule while the message that carried it is on
-- its way: which message that is, until the replica acknowledges it. The
-- message still counts the row (`held_carried`); sent again or taken back
-- before it arrives, the row moves from that count, as a record row would.
CREATE TABLE sync.let_go (
    replica    text   NOT NULL,
    table_name text   NOT NULL,
    key        text   NOT NULL,
    message    bigint NOT NULL,
    PRIMARY KEY (replica, table_name, key)
);
CREATE INDEX let_go_by_message ON sync.let_go (replica, message);

-- The counts of what each message carried (015) stay exact for the
-- messages a replica has not acknowledged, and only those are read: while
-- rows are left to their rule, a replica's acknowledgement deletes its
-- counts up to it (a count of a row let go moves with no record row). A row carried
-- since and moved on (sent again, or taken back) then moves from a count
-- that is gone: nothing is written for it, where before a count below
-- zero would have been made.
CREATE OR REPLACE FUNCTION sync.held_carried_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO sync.held_carried AS c (replica, message, table_name, rows)
        SELECT replica, message, table_name, count(*) FROM new_rows GROUP BY 1, 2, 3
        ON CONFLICT (replica, message, table_name) DO UPDATE SET rows = c.rows + excluded.rows;
    ELSIF TG_OP = 'DELETE' THEN
        WITH m AS (
            SELECT replica, message, table_name, count(*) AS n FROM old_rows GROUP BY 1, 2, 3),
        gone AS (
            DELETE FROM sync.held_carried c USING m
            WHERE c.replica = m.replica AND c.message = m.message
              AND c.table_name = m.table_name AND c.rows <= m.n)
        UPDATE sync.held_carried c SET rows = c.rows - m.n FROM m
        WHERE c.replica = m.replica AND c.message = m.message
          AND c.table_name = m.table_name AND c.rows > m.n;
    ELSE
        WITH m AS (
            SELECT replica, message, table_name, sum(n) AS n FROM (
                SELECT replica, message, table_name, 1 AS n FROM new_rows
                UNION ALL
                SELECT replica, message, table_name, -1 FROM old_rows) moved
            GROUP BY 1, 2, 3 HAVING sum(n) <> 0),
        gone AS (
            DELETE FROM sync.held_carried c USING m
            WHERE c.replica = m.replica AND c.message = m.message
              AND c.table_name = m.table_name AND c.rows + m.n <= 0),
        kept AS (
            UPDATE sync.held_carried c SET rows = c.rows + m.n FROM m
            WHERE c.replica = m.replica AND c.message = m.message
              AND c.table_name = m.table_name AND c.rows + m.n > 0)
        INSERT INTO sync.held_carried (replica, message, table_name, rows)
        SELECT replica, message, table_name, n FROM m
        WHERE n > 0 AND NOT EXISTS (
            SELECT 1 FROM sync.held_carried c
            WHERE c.replica = m.replica AND c.message = m.message AND c.table_name = m.table_name);
    END IF;
    RETURN NULL;
END $$;

DELETE FROM sync.held_carried c USING sync.acks a
WHERE c.replica = a.replica AND c.message <= a.number;
