#[derive(magic_sync::Row)]
#[row(down, replica = "unit_id", key(id))]
#[row(partition = "region_id")]
struct Order {
    id: i64,
    unit_id: i32,
    region_id: i32,
}

fn main() {}
