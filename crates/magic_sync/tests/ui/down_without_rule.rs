#[derive(magic_sync::Row)]
#[row(down, key(id))]
struct Order {
    id: i64,
}

fn main() {}
