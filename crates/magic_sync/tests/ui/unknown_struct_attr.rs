#[derive(magic_sync::Row)]
#[row(down, all, key(id), colour = "red")]
struct Order {
    id: i64,
}

fn main() {}
