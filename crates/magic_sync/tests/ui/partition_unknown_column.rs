#[derive(magic_sync::Row)]
#[row(down, partition = "region", key(id))]
struct Order {
    id: i64,
    region_id: i32,
}

fn main() {}
