#[derive(magic_sync::Row)]
#[row(down, replica = "unit", key(id))]
struct Order {
    id: i64,
    unit_id: i32,
}

fn main() {}
