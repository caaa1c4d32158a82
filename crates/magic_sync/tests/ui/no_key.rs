#[derive(magic_sync::Row)]
#[row(down, all)]
struct Order {
    id: i64,
}

fn main() {}
