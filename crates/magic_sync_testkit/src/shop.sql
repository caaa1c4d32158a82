-- The test shop: every rule and direction, a partitioned table, composite and
-- self-referencing foreign keys, and a table in another schema.
CREATE TABLE products (
    id      bigint PRIMARY KEY,
    name    text NOT NULL,
    price   numeric(10, 2) NOT NULL,
    barcode text UNIQUE
);
CREATE TABLE customers (
    id   bigint PRIMARY KEY,
    name text NOT NULL
);
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    unit_id     text NOT NULL,
    customer_id bigint REFERENCES customers ON UPDATE CASCADE,
    placed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE order_lines (
    order_id   bigint REFERENCES orders ON UPDATE CASCADE ON DELETE CASCADE,
    line_no    integer,
    product_id bigint NOT NULL REFERENCES products ON UPDATE CASCADE,
    qty        integer NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
CREATE TABLE notices (
    id        bigint PRIMARY KEY,
    region_id text NOT NULL,
    body      text NOT NULL
);
CREATE TABLE promotions (
    id         bigint PRIMARY KEY,
    product_id bigint NOT NULL REFERENCES products ON UPDATE CASCADE,
    discount   integer NOT NULL
);
CREATE TABLE promotion_members (
    group_id     bigint,
    promotion_id bigint REFERENCES promotions ON UPDATE CASCADE ON DELETE CASCADE,
    PRIMARY KEY (group_id, promotion_id)
);
-- The relay finds a promotion's groups through this index.
CREATE INDEX promotion_members_promotion ON promotion_members (promotion_id);
CREATE TABLE unit_groups (
    unit_id  text,
    group_id bigint,
    PRIMARY KEY (unit_id, group_id)
);
CREATE TABLE stock (
    unit_id    text,
    product_id bigint REFERENCES products ON UPDATE CASCADE ON DELETE CASCADE,
    on_hand    integer NOT NULL,
    counted    integer,
    PRIMARY KEY (unit_id, product_id)
);
CREATE TABLE sales (
    id          text PRIMARY KEY,
    unit_id     text NOT NULL,
    customer_id bigint REFERENCES customers,
    total       numeric NOT NULL,
    version     bigint NOT NULL
);
CREATE TABLE events (
    region text,
    id     bigint,
    body   text NOT NULL,
    PRIMARY KEY (region, id)
) PARTITION BY LIST (region);
CREATE TABLE events_north PARTITION OF events FOR VALUES IN ('north');
CREATE TABLE events_south PARTITION OF events FOR VALUES IN ('south');
CREATE SCHEMA logistics;
CREATE TABLE logistics.shipments (
    id        bigint PRIMARY KEY,
    region    text NOT NULL,
    event_id  bigint NOT NULL,
    parent_id bigint REFERENCES logistics.shipments (id),
    FOREIGN KEY (region, event_id) REFERENCES events (region, id) ON UPDATE CASCADE
);
-- The relay finds the shipments that follow an event through this index.
CREATE INDEX shipments_event ON logistics.shipments (region, event_id);
