#[derive(magic_sync::Row)]
#[row(down, all, key(id))]
struct Pair(i64, String);

fn main() {}
