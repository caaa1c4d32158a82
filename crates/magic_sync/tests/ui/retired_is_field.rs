#[derive(magic_sync::Row)]
#[row(down, all, key(id), retired = "retired")]
struct Order {
    id: i64,
    retired: bool,
}

fn main() {}
