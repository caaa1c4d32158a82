#[derive(magic_sync::Row)]
#[row(down, all, key(id), lane = "fast")]
struct Price {
    id: i64,
    cents: i64,
}

fn main() {}
