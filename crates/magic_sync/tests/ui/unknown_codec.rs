#[derive(magic_sync::Row)]
#[row(down, all, key(id), codec = yaml)]
struct Order {
    id: i64,
}

fn main() {}
