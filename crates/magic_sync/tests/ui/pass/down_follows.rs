use magic_sync::row::{Row, Rule};

/// A composite foreign key to the parent, order kept.
#[derive(magic_sync::Row)]
#[row(
    down,
    follows = "region, order_number",
    key(region, order_number, line)
)]
struct OrderLine {
    region: String,
    order_number: i64,
    line: i32,
}

fn main() {
    assert_eq!(
        OrderLine::TABLE.rule,
        Rule::Follows(&["region", "order_number"])
    );
}
