#[derive(magic_sync::Row)]
#[row(down, all, key(id))]
#[row(up)]
struct Order {
    id: i64,
}

fn main() {}
