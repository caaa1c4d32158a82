use magic_sync::row::{Row, Rule};

/// Rows whose `unit_id` is the replica's id; attributes split over several `#[row]`s.
#[derive(magic_sync::Row)]
#[row(down)]
#[row(replica = "unit_id")]
#[row(key(id), retired = "retired")]
struct Order {
    id: i64,
    unit_id: i32,
    note: Option<String>,
}

fn main() {
    assert_eq!(Order::TABLE.rule, Rule::Replica("unit_id"));
    assert_eq!(Order::TABLE.retired, Some("retired"));
}
