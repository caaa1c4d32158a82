#[derive(magic_sync::Row)]
#[row(down, all, key(id))]
struct Order<T> {
    id: i64,
    extra: T,
}

fn main() {}
