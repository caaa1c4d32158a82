#[derive(magic_sync::Row)]
#[row(all, key(id))]
struct Order {
    id: i64,
}

fn main() {}
