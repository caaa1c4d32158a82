use magic_sync::row::{Row, Rule};

#[derive(magic_sync::Row)]
#[row(down, partition = "region_id", key(id))]
struct Price {
    id: i64,
    region_id: i32,
    amount: magic_sync::Numeric,
}

fn main() {
    assert_eq!(Price::TABLE.rule, Rule::Partition("region_id"));
}
